"""The physical floor: no time below what the device can do for a call is paid.

A timed call must read its inputs and write its outputs (``RefTrialsAnswer.call_bytes``: each
tensor's distinct elements, on the task's own inputs). No kernel moves them faster than the most
this device was ever measured to move (``child/bandwidth.py``: the largest of copies and sums from
4 MiB to 1 GiB, caches flushed first, cached per device here), and not by ``SLACK`` past it (a
kernel's own loads can beat torch's copy by some percent). So a call takes at least
``call_bytes / (bytes_per_ms * SLACK)``, whatever made a time lower: work outside the clock, an
evaluator's fault, a clock that lied. docs/security.md, The physical floor.

- **Surely under** (its time plus ``CONFIDENCE`` standard errors still below): refused as a finding,
  both figures in the message (``surely_below``, ``message``; the harness, after every call the
  timing run may add).
- **Under, not surely** (its time below, within the noise): timed further (``reward.close_calls``)
  and, still under, paid no speed-up (``reward.established_milestone``): the measurement cannot tell
  it from a time the device cannot reach.
- **No floor** where the task's own eager code ran under it (``floor_ms``): the bytes a call is given
  are then more than its answer needs (an input it ignores, a slice of one), and the count says
  nothing of what a kernel must move. The eager time is the judge's own, never the candidate's.

Only bytes: a task's FLOPs are not FLOPs its answer must do. A GEMM followed by a sum over its
columns (KernelBench level 2, problem 18: 137 GFLOP as written) has an answer that needs one
matrix-vector product with the weight's column sums, computed once at init; Winograd and FFT
convolutions, and Strassen's products, do fewer multiplications than the definition. A floor from
the reference's FLOPs at the device's peak would refuse such kernels, which are honest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from kernel_env.evaluators.records import Timing
from kernel_env.evaluators.reward import CONFIDENCE

#: How far past the measured bandwidth a kernel may move a call's bytes.
SLACK = 1.5


class BandwidthCache:
    """The most bytes per millisecond each device was measured to move, on disk beside the baselines
    (``BaselineCache.directory``), keyed by the device's name: a measurement only ever raises it (a
    measurement can be slowed by a neighbour, never sped up, and a higher figure only lowers the floor)."""

    def __init__(self, directory: Path):
        self.directory = directory

    def _path(self, device_name: str) -> Path:
        return self.directory / f"bandwidth-{hashlib.sha256(device_name.encode()).hexdigest()[:16]}.json"

    def get(self, device_name: str) -> float | None:
        try:
            value = json.loads(self._path(device_name).read_text())["bytes_per_ms"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def put(self, device_name: str, bytes_per_ms: float) -> float:
        """Store the larger of ``bytes_per_ms`` and the figure held; returns what is stored."""
        best = max(bytes_per_ms, self.get(device_name) or 0.0)
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump({"device": device_name, "bytes_per_ms": best}, handle)
        os.replace(tmp, self._path(device_name))
        return best


def floor_ms(call_bytes: int, bytes_per_ms: float | None, eager: Timing | None) -> float | None:
    """The least time a call of this task can take on the device, or None: no bandwidth or no bytes
    known, or the task's own eager code (``eager``, the judge's own measurement) ran under it."""
    if not call_bytes or not bytes_per_ms or eager is None:
        return None
    floor = call_bytes / (bytes_per_ms * SLACK)
    return floor if eager.median_ms >= floor else None


def surely_below(runtime: Timing | None, floor: float | None) -> bool:
    """Whether ``runtime`` lies under the floor by more than ``CONFIDENCE`` of its standard errors (a
    time under it within them is timed further and paid no speed-up: ``reward``)."""
    return (runtime is not None and floor is not None
            and runtime.median_ms + CONFIDENCE * (runtime.sem_ms or 0.0) < floor)


def message(runtime: Timing, floor: float, call_bytes: int, bytes_per_ms: float) -> str:
    return (f"timed at {runtime.median_ms:.4g} ms a call (standard error {runtime.sem_ms or 0.0:.2g} ms), under the "
            f"physical floor of {floor:.4g} ms: a call reads its inputs and writes its outputs, "
            f"{call_bytes / 1e6:.4g} MB, and this device has never moved more than {bytes_per_ms / 1e6:.4g} GB/s "
            f"(the floor allows {SLACK:g}x that). No kernel is that fast: the work was done outside the timed "
            f"call, or the timing was interfered with")
