"""The memory of a process tree, read from /proc (Linux only); shared by the benchmarks that measure it.

Two measures per process. RSS (``/proc/PID/status``) counts every resident page the process maps,
so a page shared by several processes (a library, the Python binary) counts once in each of them:
a sum over processes is an upper bound. PSS (``/proc/PID/smaps_rollup``) splits each shared page
evenly among the processes that map it: a sum over processes is the tree's fair share, and adding
a process that only shares pages moves part of the others' PSS onto it. Neither counts the
kernel's own memory for a process (page tables, kernel stacks, sockets, namespaces).

Reading a process that ended while we looked is not an error: it reads as absent (None or 0).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, ``root`` first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def rss(pid: int) -> int:
    """Resident bytes of a process; 0 if it is gone."""
    return _status_field(pid, "VmRSS") * 1024


def threads(pid: int) -> int:
    """Threads of a process; 0 if it is gone."""
    return _status_field(pid, "Threads")


def _status_field(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def command_line(pid: int) -> list[str]:
    """A process's argv; [] if it is gone (or a kernel thread)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory in bytes: RSS and PSS, the PSS split into anonymous (heap, stacks:
    the process's own) and file-backed (code and data of the binary and libraries) pages."""

    pid: int
    argv: tuple[str, ...]
    rss: int
    pss: int
    pss_anon: int
    pss_file: int
    pss_shmem: int


def process_memory(pid: int) -> ProcessMemory | None:
    """RSS and PSS of one process from its smaps_rollup; None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines()[1:]:  # the first line is the rollup's address range
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[name] = int(value.split()[0]) * 1024
    if "Pss" not in fields:
        return None  # a zombie: smaps_rollup is empty
    return ProcessMemory(pid, tuple(command_line(pid)), fields["Rss"], fields["Pss"], fields.get("Pss_Anon", 0),
                         fields.get("Pss_File", 0), fields.get("Pss_Shmem", 0))


def tree_memory(root: int | None = None) -> list[ProcessMemory]:
    """The memory of ``root`` (this process by default) and of every process below it, ``root`` first."""
    found = (process_memory(pid) for pid in descendants(os.getpid() if root is None else root))
    return [memory for memory in found if memory is not None]


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (the host's, not this tree's: every other process moves it too)."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0]) * (1024 if value.strip().endswith("kB") else 1)
    return fields


class TreeMemory:
    """Samples the summed resident memory of this process and all its descendants; keeps the peak."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s, self.peak_bytes, self.peak_processes = interval_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            tree = descendants(os.getpid())
            total = sum(rss(pid) for pid in tree)
            self.peak_bytes, self.peak_processes = max(self.peak_bytes, total), max(self.peak_processes, len(tree))
            self._stop.wait(self.interval_s)
