"""The operator's tools: what this machine can run (``kernel-env doctor``)."""
