"""raise SystemExit(0) while model_new.py is imported. Must be a clear error."""

raise SystemExit(0)
