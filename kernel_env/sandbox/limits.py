"""Resource limits for everything a sandbox runs: memory, processes, file size, core dumps.

Two layers. Resource limits (setrlimit) are inherited by every process of the sandbox and
work everywhere, but the kernel does not apply the process-count limit to processes whose
host uid is root. A cgroup (v2, or v1's pids and memory controllers) caps the whole sandbox
as one, and is used wherever this process may create one (root, or a delegated subtree).
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 8 * _GIB          # whole sandbox (cgroup), and the per-process address-space cap below
    address_space_bytes: int = 24 * _GIB  # per process; torch alone maps ~3.3 GB of address space
    processes: int = 512
    file_size_bytes: int = 2 * _GIB
    open_files: int = 4096

    def rlimits(self) -> dict[str, int]:
        """The per-process limits by ``resource`` name, each at most this process's hard limit."""
        limits = {}
        for name, value in (
            ("RLIMIT_AS", self.address_space_bytes),
            ("RLIMIT_NPROC", self.processes),
            ("RLIMIT_FSIZE", self.file_size_bytes),
            ("RLIMIT_NOFILE", self.open_files),
            ("RLIMIT_CORE", 0),
        ):
            _, hard = resource.getrlimit(getattr(resource, name))
            limits[name] = value if hard == resource.RLIM_INFINITY else min(value, hard)
        return limits

    def apply_rlimits(self) -> None:
        """Set the per-process limits on the calling process (used as a preexec hook)."""
        for name, value in self.rlimits().items():
            resource.setrlimit(getattr(resource, name), (value, value))


class Cgroup:
    """A cgroup holding one sandbox; ``create`` returns None where none can be made.

    ``freeze()`` stops every process in it (cgroup v2's ``cgroup.freeze``, or v1's freezer
    controller where it is mounted and writable) and ``thaw()`` lets them run again."""

    def __init__(self, dirs: list[Path], freezer: Path | None = None):
        self.dirs = dirs
        self._freezer = freezer  # v1: the freezer controller's directory (v2 freezes in dirs[0])

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
        name = f"{_owned_prefix()}{uuid.uuid4().hex[:12]}"
        try:
            return cls._create_v2(name, limits) or cls._create_v1(name, limits)
        except OSError as exc:
            log.debug("no cgroup for the sandbox: %s", exc)
            return None

    @classmethod
    def _create_v2(cls, name: str, limits: Limits) -> Cgroup | None:
        root = Path("/sys/fs/cgroup")
        if not (root / "cgroup.controllers").exists():
            return None
        # Our own cgroup must be delegated to us; a child of it can only hold processes if its
        # parent holds none, so sandboxes go into a sibling tree we create under our parent.
        own = Path(open("/proc/self/cgroup").read().strip().split("::", 1)[-1].lstrip("/"))
        parent = root / own.parent / "kernel_env"
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+pids +memory")
        group = parent / name
        group.mkdir()
        (group / "pids.max").write_text(str(limits.processes))
        (group / "memory.max").write_text(str(limits.memory_bytes))
        (group / "memory.swap.max").write_text("0") if (group / "memory.swap.max").exists() else None
        return cls([group])

    @classmethod
    def _create_v1(cls, name: str, limits: Limits) -> Cgroup | None:
        pids_root, mem_root = Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory")
        if not (os.access(pids_root, os.W_OK) and os.access(mem_root, os.W_OK)):
            return None
        pids, mem = pids_root / "kernel_env" / name, mem_root / "kernel_env" / name
        pids.mkdir(parents=True)
        mem.mkdir(parents=True)
        (pids / "pids.max").write_text(str(limits.processes))
        (mem / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        dirs, freezer = [pids, mem], None
        freezer_root = Path("/sys/fs/cgroup/freezer")
        if os.access(freezer_root, os.W_OK):
            freezer = freezer_root / "kernel_env" / name
            freezer.mkdir(parents=True)
            dirs.append(freezer)
            _reap_when_gone()
        return cls(dirs, freezer)

    def enter(self) -> None:
        """Move the calling process into the cgroup (used as a preexec hook)."""
        self.add(0)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (0: the calling one) into the cgroup; its children are born in it."""
        for directory in self.dirs:
            (directory / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.dirs:
            try:
                found |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found)

    def freeze(self, wait: bool = True) -> bool:
        """Stop every process in the cgroup; True once the kernel reports them stopped. ``wait=False``:
        only ask, True where asked (``frozen`` says when they are)."""
        try:
            if self._freezer is not None:
                (self._freezer / "freezer.state").write_text("FROZEN")
            elif (self.dirs[0] / "cgroup.freeze").exists():
                (self.dirs[0] / "cgroup.freeze").write_text("1")
            else:
                return False
        except OSError as exc:
            log.debug("cannot freeze cgroup %s: %s", self.dirs[0], exc)
            return False
        if not wait:
            return True
        deadline = time.monotonic() + 2.0
        while not self.frozen():
            if time.monotonic() > deadline:
                self.thaw()
                return False
            time.sleep(0.001)
        return True

    def frozen(self) -> bool:
        """Whether the kernel reports every process of the cgroup stopped."""
        try:
            if self._freezer is not None:
                return (self._freezer / "freezer.state").read_text().strip() == "FROZEN"
            return "frozen 1" in (self.dirs[0] / "cgroup.events").read_text()
        except OSError:
            return False

    def thaw(self) -> None:
        try:
            if self._freezer is not None:
                (self._freezer / "freezer.state").write_text("THAWED")
            elif (self.dirs[0] / "cgroup.freeze").exists():
                (self.dirs[0] / "cgroup.freeze").write_text("0")
        except OSError as exc:
            log.debug("cannot thaw cgroup %s: %s", self.dirs[0], exc)

    def destroy(self) -> None:
        """Kill whatever is still inside and remove the cgroup."""
        import signal

        self.thaw()  # a frozen process would not die before it ran again (cgroup v1)
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for directory in self.dirs:
            try:
                directory.rmdir()
            except OSError as exc:
                log.warning("could not remove cgroup %s: %s", directory, exc)


def _owned_prefix() -> str:
    """The names of the cgroups this process makes begin so: the reaper finds them by it."""
    return f"kernel_env-{os.getpid()}-"


#: Run by the reaper: waits for the end of its standard input (the process that made the cgroups
#: is gone, however it died), then kills what is left in them, thaws them, and removes them.
_REAPER = r"""
import os, signal, sys, time
from pathlib import Path
sys.stdin.buffer.read()
groups = [g for c in ("freezer", "pids", "memory") for g in Path("/sys/fs/cgroup", c, "kernel_env").glob(sys.argv[1] + "*")]
for _ in range(25):
    left = False
    for group in groups:
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                left = True
                os.kill(int(pid), signal.SIGKILL)
            if (group / "freezer.state").exists():
                (group / "freezer.state").write_text("THAWED")
        except (OSError, ValueError):
            pass
    if not left:
        break
    time.sleep(0.2)
for group in groups:
    try:
        group.rmdir()
    except OSError:
        pass
"""
_reapers: dict[int, subprocess.Popen] = {}
_reapers_lock = threading.Lock()


def _reap_when_gone() -> None:
    """Start, once per process, a reaper of the v1 freezer cgroups it makes. A process frozen by
    cgroup v1 cannot die until it is thawed, not even of SIGKILL: a host killed during a timing run
    (a trainer's SIGTERM, Ctrl-C) would leave the jobs it had frozen in the refrigerator for good,
    holding their memory (12 GB of a KernelBench job on a test box). Cgroup v2 lets a frozen process die."""
    with _reapers_lock:
        if os.getpid() in _reapers:
            return
        try:
            _reapers[os.getpid()] = subprocess.Popen(
                [sys.executable, "-I", "-c", _REAPER, _owned_prefix()], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.debug("no reaper for this process's frozen cgroups: %s", exc)
