"""Precompiled torch headers for workspace builds, made by the trusted host.

Parsing torch's and pybind11's headers is about half of a binding source's compile time.
``precompile(language)`` runs the workspace's own ``utils/build.py --precompile`` here, on the
host, so the header fits the compiler and flags a sandbox's build uses; the result lands in
``headers_dir()/<key>/``, one key per compiler and flags, with the object of the protected
``binding.cpp`` built against it, and the toolchain's torch settings beside. Every sandbox mounts that folder
read-only at ``SANDBOX_HEADERS`` (``$KE_HEADERS`` in its environment): one episode cannot
change what another one's build includes. A build that finds no header for its key (none made
yet, another toolchain, ``KERNEL_ENV_PRECOMPILED_HEADERS=0``) compiles as before.

``prepare(language)``, called when a C++ or CUDA sandbox starts, precompiles in the background
once per toolchain; a file lock keeps two processes from doing the same work. ``worth_making``
says which headers a host can use (``kernel-env headers`` without an argument makes those).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kernel_env.config import cache_dir, precompiled_headers
from kernel_env.resources import data_dir

log = logging.getLogger(__name__)

SANDBOX_HEADERS = "/run/kernel_env/headers"
#: The languages whose workspaces build C++ (Triton builds nothing ahead of time).
LANGUAGES = ("cpp", "cuda")

_started: set[str] = set()
_lock = threading.Lock()


def enabled() -> bool:
    return precompiled_headers()


def headers_dir() -> Path:
    return cache_dir() / "headers"


def host_folder() -> Path | None:
    """The folder every sandbox mounts read-only at SANDBOX_HEADERS (made if missing), or None
    when precompiled headers are off (``KERNEL_ENV_PRECOMPILED_HEADERS=0``)."""
    if not enabled():
        return None
    folder = headers_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def worth_making(device: str) -> tuple[list[str], dict[str, str]]:
    """(the languages whose headers are worth making on this host, {skipped language: why}), for
    a host whose device is ``device`` (``kernel_env.runtime.episode.default_device()``): the cuda
    header (about 500 MB) only where cuda workspaces can build and run, with a GPU and nvcc."""
    skipped = {}
    if device != "cuda":
        skipped["cuda"] = "no GPU here, so no cuda workspaces"
    elif not _nvcc():
        skipped["cuda"] = "no nvcc found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"
    return [language for language in LANGUAGES if language not in skipped], skipped


def _nvcc() -> str | None:
    """nvcc where a workspace build looks for it (utils/build.py's find_cuda)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    found = [str(Path(home) / "bin" / "nvcc") for home in homes if home and (Path(home) / "bin" / "nvcc").is_file()]
    return found[0] if found else shutil.which("nvcc")


def precompile(language: str, *, timeout: float = 900.0) -> subprocess.CompletedProcess:
    """Precompile the torch headers for ``language``'s workspaces (``cpp`` or ``cuda``) with this
    host's toolchain; returns the finished ``build.py --precompile`` (its output says where).
    Does nothing when the header for this toolchain is already there."""
    if language not in LANGUAGES:
        raise ValueError(f"no headers to precompile for {language!r} workspaces; one of {', '.join(LANGUAGES)}")
    root = headers_dir()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kernel_env-headers-") as scratch, open(root / f".lock-{language}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process making the same header: wait, then find it there
        workspace = Path(scratch)
        template = data_dir("workspace_template")
        # The whole of utils/: build.py imports the build's modules beside it, and its toolchain
        # key hashes them, so the settings written here fit a workspace's build.
        shutil.copytree(template / "utils", workspace / "utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for fixed in ("binding.cpp", "binding_registry.h"):  # compiled once here, linked by every workspace
            shutil.copy(template / fixed, workspace / fixed)
        (workspace / "SKILL.md").write_text(f"---\nname: {language}\n---\n")
        env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        return subprocess.run([sys.executable, "-B", str(workspace / "utils" / "build.py"), "--precompile", str(root)],
                              cwd=workspace, env=env, capture_output=True, text=True, timeout=timeout)


def prepare(language: str) -> None:
    """Precompile in the background, once per language in this process (see the module docstring)."""
    if language not in LANGUAGES or not enabled():
        return
    with _lock:
        if language in _started:
            return
        _started.add(language)
    threading.Thread(target=_precompile_quietly, args=(language,), name=f"kernel_env-headers-{language}", daemon=True).start()


def _precompile_quietly(language: str) -> None:
    try:
        proc = precompile(language)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("precompiling the torch headers for %s workspaces failed: %s", language, exc)
        return
    if proc.returncode != 0:
        log.warning("precompiling the torch headers for %s workspaces failed: %s", language, proc.stdout.strip()[-500:])
