"""``python -m kernel_env.cli``: the same command as ``kernel-env``."""

from kernel_env.cli import app

app()
