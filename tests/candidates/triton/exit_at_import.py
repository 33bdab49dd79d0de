"""os._exit(0) while model_new.py is imported. Must be a clear error."""

from os import _exit

_exit(0)
