"""Where kernel_env keeps things on the host, and the embedded defaults.

Everything is under ``$KERNEL_ENV_HOME`` (default ``~/.cache/kernel_env``): episode
workspaces, the baseline cache, logs. Nothing here is ever mounted writable into a sandbox
except an episode's own workspace and state directory.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SANDBOX = "local"
DEFAULT_POOL = "local"


def home() -> Path:
    return Path(os.environ.get("KERNEL_ENV_HOME") or Path.home() / ".cache" / "kernel_env")


def workspaces_dir() -> Path:
    return home() / "workspaces"


def cache_dir() -> Path:
    return home() / "cache"
