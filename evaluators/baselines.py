"""Baseline timings (eager PyTorch and torch.compile), measured once and cached on disk.

Keyed by (task content hash, device name, torch version, timing protocol version and the
settings a timing depends on): a different GPU model, torch build or timing protocol is a
different baseline. Measured by the same protocol as candidates: a worker process runs the task's
Model (or torch.compile of it) and the judge times its calls (``child/judge.py``).

An entry only ever gets faster: a job whose candidate seems faster than the baselines times them
again after it and keeps the faster of each (``harness._Script.confirm_speedup``), so a baseline
timed during a disturbance pays no speed-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

from kernel_env.config import cache_dir
from kernel_env.evaluators.child.protocol import PROTOCOL_VERSION
from kernel_env.evaluators.records import Timing


class BaselineCache:
    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else cache_dir() / "baselines"
        self._lock = threading.Lock()

    @staticmethod
    def key(task_code: str, device_name: str, torch_version: str, protocol: dict | None = None) -> str:
        raw = json.dumps([hashlib.sha256(task_code.encode()).hexdigest(), device_name, torch_version, PROTOCOL_VERSION,
                          protocol or {}], sort_keys=True)
        return hashlib.sha256(raw.encode()).hexdigest()[:24]

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> tuple[Timing, Timing | None] | None:
        try:
            record = json.loads(self._path(key).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        compiled = record.get("compile")
        return Timing(**record["eager"]), Timing(**compiled) if compiled else None

    def put(self, key: str, eager: Timing, compiled: Timing | None) -> tuple[Timing, Timing | None]:
        """Store the timings, each where it is faster than the one stored (jobs confirming at once);
        returns what is stored."""
        with self._lock:
            stored = self.get(key)
            if stored is not None:
                eager, compiled = faster_of(stored[0], eager), faster_of(stored[1], compiled)
            self.directory.mkdir(parents=True, exist_ok=True)
            record = {"eager": eager.model_dump(), "compile": compiled.model_dump() if compiled else None}
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle)
            os.replace(tmp, self._path(key))
            return eager, compiled


def faster_of(first: Timing | None, second: Timing | None) -> Timing | None:
    """The timing with the smaller median (either, where the other is missing)."""
    if first is None or second is None:
        return first or second
    return min(first, second, key=lambda timing: timing.median_ms)
