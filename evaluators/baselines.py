"""The torch.compile baseline, timed once per task and cached on disk, with the eager time it was timed beside;
and the tasks found to have no trivial answer (``screened``).

Keyed by (task content hash, device name, torch version, timing protocol version and the
settings a timing depends on): a different GPU model, torch build or timing protocol is a
different baseline. The judge times the task's Model and torch.compile of it in its own process,
their calls alternating (``RefTime``), so the two share whatever pace the machine had; a job
uses the compiled time scaled by its own eager time over the cached one (``clock.scaled``). The
eager time a candidate is held against is never the cache's: every timed job times it anew, beside
the candidate's yardstick (``harness._Script.yardstick``). Nothing here is a minimum of many
timings: an estimate that only ever moves one way drifts from the truth as timings accumulate.
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

    def screened(self, key: str) -> bool:
        """Whether the task of ``key`` (its code and the settings its trials depend on) was searched
        for trivial answers and found to have none (``harness``: a task's property, not a job's)."""
        return (self.directory / "screened" / key).is_file()

    def mark_screened(self, key: str) -> None:
        folder = self.directory / "screened"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / key).touch()

    def put(self, key: str, eager: Timing, compiled: Timing | None) -> tuple[Timing, Timing | None]:
        """Store the two timings (timed together); returns them."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            record = {"eager": eager.model_dump(), "compile": compiled.model_dump() if compiled else None}
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle)
            os.replace(tmp, self._path(key))
            return eager, compiled
