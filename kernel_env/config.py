"""Where kernel_env keeps things on the host, the embedded defaults, and every setting it reads
from the environment: each ``KERNEL_ENV_*`` variable is read here, nowhere else (but the
workspace's build script, which runs in the sandbox, reads its own ``KERNEL_ENV_CUDA_ARCH``).

Everything is under ``$KERNEL_ENV_HOME`` (default ``~/.cache/kernel_env``): episode
workspaces, the baseline cache, logs. Nothing here is ever mounted writable into a sandbox
except an episode's own workspace and state directory.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SANDBOX = "local"
DEFAULT_POOL = "local"
#: The comparison's tolerance (KernelBench's): ``EvalSettings`` (the evaluations), the task check
#: (``tasks.validate``, ``kernel-env tasks --check``) and the synthesis filter start from these.
DEFAULT_ATOL = DEFAULT_RTOL = 1e-2
#: "More than 5 % faster": the milestone reward's margin over a baseline (EvalSettings.speedup_margin).
DEFAULT_SPEEDUP_MARGIN = 0.05


def home() -> Path:
    return Path(os.environ.get("KERNEL_ENV_HOME") or Path.home() / ".cache" / "kernel_env")


def kernelbench_root() -> str | None:
    """A KernelBench checkout: ``KERNEL_ENV_KERNELBENCH`` (``kernelbench/L1/...`` task names, the
    synthesis's decontamination set)."""
    return os.environ.get("KERNEL_ENV_KERNELBENCH") or None


def jobs_per_gpu() -> int:
    """Jobs one GPU runs at once: ``KERNEL_ENV_JOBS_PER_GPU``, else 4."""
    return _whole_jobs("KERNEL_ENV_JOBS_PER_GPU", 4)


def jobs_per_cpu() -> int:
    """Jobs the CPU device runs at once: ``KERNEL_ENV_JOBS_PER_CPU``, else 2 (a job that hangs
    then takes one slot, while the other's timing runs freeze it)."""
    return _whole_jobs("KERNEL_ENV_JOBS_PER_CPU", 2)


def warm_children(gpu: bool) -> bool:
    """Whether evaluation jobs take children started ahead of them: on GPU devices, unless
    ``KERNEL_ENV_WARM_CHILDREN=0``; on the CPU only with ``KERNEL_ENV_WARM_CHILDREN=1`` (there a
    spare has nothing to make ahead, no CUDA context, and a fork costs milliseconds)."""
    setting = os.environ.get("KERNEL_ENV_WARM_CHILDREN", "")
    return setting == "1" or (gpu and setting != "0")


def precompiled_headers() -> bool:
    """Whether workspace builds use the host's precompiled torch headers (``KERNEL_ENV_PRECOMPILED_HEADERS=0``: not)."""
    return os.environ.get("KERNEL_ENV_PRECOMPILED_HEADERS", "1") != "0"


def _whole_jobs(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return max(1, int(value))
    except ValueError:
        raise ValueError(f"{name}={value!r}: give a whole number of jobs (1 runs one job at a time)") from None


def workspaces_dir() -> Path:
    return home() / "workspaces"


def cache_dir() -> Path:
    return home() / "cache"
