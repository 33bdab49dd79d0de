"""The GPU's own counters over time, sampled by ``nvidia-smi`` in the background, for benchmarks.

NVML's ``utilization.gpu`` is the share of its sample period (1/6 s to 1 s, by GPU) in which any
kernel ran; ``clocks.sm`` is the SM clock at the sample. Both come from the driver, not from us,
so they are an independent account of what the device did.

    with GpuSampler() as gpu:
        ...
    gpu.samples_between(t0, t1)  # [(time.monotonic(), {"utilization.gpu": 37.0, "clocks.sm": 1980.0})]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

FIELDS = ("utilization.gpu", "clocks.sm")


class GpuSampler:
    def __init__(self, period_ms: int = 50, fields: tuple[str, ...] = FIELDS, index: int = 0):
        self.fields, self.period_ms, self.index = fields, period_ms, index
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._proc is not None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(
                ["nvidia-smi", f"--id={self.index}", f"--query-gpu={','.join(self.fields)}",
                 "--format=csv,noheader,nounits", f"-lms={self.period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                values = [float(part) for part in line.split(",")]
            except ValueError:  # "[N/A]", a header
                continue
            self.samples.append((time.monotonic(), dict(zip(self.fields, values))))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)
            self._reader.join(timeout=5)

    def samples_between(self, start: float, end: float) -> list[dict[str, float]]:
        return [values for at, values in self.samples if start <= at <= end]

    def mean(self, field: str, start: float, end: float) -> float | None:
        values = [s[field] for s in self.samples_between(start, end) if field in s]
        return statistics.fmean(values) if values else None

    def minimum(self, field: str, start: float, end: float) -> float | None:
        values = [s[field] for s in self.samples_between(start, end) if field in s]
        return min(values) if values else None
