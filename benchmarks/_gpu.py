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


def do_bench_times(task_code: str, solution_code: str) -> dict[str, dict[str, float]]:
    """The independent peers, in this process, on one input set: Triton's ``do_bench`` medians (ms) of
    the task's Model (``eager``), ``torch.compile`` of it (``compile``) and the solution's ModelNew
    (``candidate``), under "do_bench" (events around each call, the L2 flushed between calls: a small
    kernel's time holds its host launches); ``do_bench_cudagraph``'s under "cudagraph" (a CUDA
    graph's replays: the device's time alone, but with the inputs left in the L2 by the call before);
    and under "cold_graph", a graph of the L2 flush and the call less a graph of the flush alone: the
    device's time on cold caches, as kernel_env times a call (queued ahead of its start, after a
    flush)."""
    import importlib.util
    import tempfile
    from pathlib import Path

    import torch
    import triton.testing

    folder = Path(tempfile.mkdtemp())
    loaded = {}
    for name, code in (("task", task_code), ("model_new", solution_code)):
        (folder / f"{name}.py").write_text(code)  # Triton needs a kernel's source file
        spec = importlib.util.spec_from_file_location(f"_peer_{name}", folder / f"{name}.py")
        loaded[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded[name])
    task = loaded["task"]
    torch.manual_seed(0)
    init = task.get_init_inputs()
    with torch.device("cuda"):
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    torch.manual_seed(0)
    model = task.Model(*init).cuda().eval()
    torch.manual_seed(0)
    candidate = loaded["model_new"].ModelNew(*init).cuda().eval()
    compiled = torch.compile(model)
    found: dict[str, dict[str, float]] = {"do_bench": {}, "cudagraph": {}, "cold_graph": {}}
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with torch.no_grad(), torch.cuda.stream(torch.cuda.Stream()):
        flush = triton.testing.do_bench_cudagraph(lambda: cache.zero_(), return_mode="median")
        for name, run in (("eager", model), ("compile", compiled), ("candidate", candidate)):
            found["do_bench"][name] = triton.testing.do_bench(lambda run=run: run(*inputs), return_mode="median")
            found["cudagraph"][name] = triton.testing.do_bench_cudagraph(lambda run=run: run(*inputs), return_mode="median")
            both = triton.testing.do_bench_cudagraph(lambda run=run: (cache.zero_(), run(*inputs)), return_mode="median")
            found["cold_graph"][name] = both - flush
    return found
