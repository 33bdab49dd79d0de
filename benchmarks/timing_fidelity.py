"""Timing fidelity: one kernel evaluated in N separate jobs, and agreement with do_bench.

For a fused Triton relu(x + y) on 16M float32 elements (about 190 MB moved per call, ~72 us
on an H100) and for the eager PyTorch baseline, runs N independent evaluation jobs through
the local pool and reports the spread of the medians, (max - min) / median (the target is
<= 2 % for kernels >= 50 us), next to triton.testing.do_bench's median for the same
callables measured in this process, the independent peer. Each launch-cover setting given
(EvalSettings.launch_cover_us; 0 is no cover: the launch is timed) is run in turn, so the
protocols are compared in the same run.

Each job's line also says what its timings were made of (the timing runs' ``details``, caught
on their way from the evaluation child): the host's launch time against the cover, the charge
for work still running after the end mark, and the idle synchronise tail that charge is
measured against. A slow job is then explained by the line that moved.

``--solution side_stream_no_wait --elements 1048576`` measures the charge for work left running
on a side stream (the kernel is never joined to the current stream) against the same kernel on
the current stream (``--solution turn4_fused``, the default): the two should agree. do_bench is
no peer there: its events sit on the current stream and miss the side stream's work.

    python benchmarks/timing_fidelity.py [--jobs 10] [--covers 0,200] [--elements N] [--solution NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _gpu import (
    GpuSampler,  # benchmarks/_gpu.py: run as a script, this folder is on sys.path
)

from kernel_env.evaluators import children
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.records import EvalSettings, Mode
from kernel_env.runtime.episode import Episode
from kernel_env.runtime.pool import LocalPool
from kernel_env.tasks import Task

HERE = Path(__file__).resolve().parent
TASK_CODE = (HERE.parent / "examples" / "relu_add" / "task.py").read_text()
SOLUTIONS = HERE.parent / "tests" / "gpu" / "solutions"


def do_bench_medians(kernel_file: Path, elements: int) -> dict[str, float]:
    import importlib.util

    import triton.testing

    spec = importlib.util.spec_from_file_location(kernel_file.stem, kernel_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # Triton needs the kernel's source file
    model = module.ModelNew().cuda()
    x, y = torch.randn(elements, device="cuda"), torch.randn(elements, device="cuda")
    return {
        "candidate": triton.testing.do_bench(lambda: model(x, y), return_mode="median"),
        "eager": triton.testing.do_bench(lambda: torch.relu(x + y), return_mode="median"),
    }


class TimingDetails:
    """Catches the timing runs' details (``time_calls(details=...)``) as the children answer."""

    def __init__(self):
        self.runs: dict[str, dict] = {}
        self.windows: dict[str, tuple[float, float]] = {}  # monotonic start and end of each timing run
        self._call = children.Child.call

    def __enter__(self):
        catcher = self

        def call(child, cmd, timeout, **payload):
            started = time.monotonic()
            answer, marks = catcher._call(child, cmd, timeout, **payload)
            if cmd in ("cand_time", "ref_time") and isinstance(answer.get("details"), dict):
                name = "candidate" if cmd == "cand_time" else "eager"
                catcher.runs[name] = {**answer["details"], "times_ms": answer.get("times_ms", [])}
                catcher.windows[name] = (started, time.monotonic())
            return answer, marks

        children.Child.call = call
        return self

    def __exit__(self, *exc):
        children.Child.call = self._call


def summary(details: dict | None, window: tuple[float, float] | None, gpu: GpuSampler) -> dict:
    if not details:
        return {}
    med = lambda key, scale=1.0: round(statistics.median(details[key]) * scale, 1)  # noqa: E731
    parts = {"launch_us_median": med("launch_us"), "launch_us_max": round(max(details["launch_us"]), 1),
             "charged_us_median": med("charged_ms", 1e3), "tail_us_median": med("tail_ms", 1e3),
             "idle_tail_us_median": med("idle_tail_ms", 1e3), "allowance_us": round(details["allowance_ms"] * 1e3, 1)}
    if window and gpu.available:  # the SM clock around the run (the driver's, sampled every 50 ms; a run is short)
        around = (window[0] - 0.25, window[1] + 0.05)
        low, mean = gpu.minimum("clocks.sm", *around), gpu.mean("clocks.sm", *around)
        parts |= {"sm_mhz_min": low, "sm_mhz_mean": round(mean) if mean else None}
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--covers", default=f"0,{EvalSettings().launch_cover_us:g}",
                        help="comma-separated launch_cover_us values to compare (default: 0 and the default)")
    parser.add_argument("--elements", type=int, default=1 << 24, help="elements of x and y (default 16M)")
    parser.add_argument("--solution", default="turn4_fused", help="the candidate: a file of tests/gpu/solutions, without .py")
    parser.add_argument("--json", type=Path, default=Path("timing_fidelity.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("timing_fidelity needs a CUDA GPU", file=sys.stderr)
        return 2
    task = Task(id=f"bench/relu_add_{args.elements}", code=TASK_CODE.replace("1 << 24", str(args.elements)), source="synthetic")
    kernel_file = SOLUTIONS / f"{args.solution}.py"
    solution = Path(tempfile.mkdtemp()) / "solution"
    solution.mkdir()
    (solution / "model_new.py").write_text(kernel_file.read_text())
    peer = do_bench_medians(kernel_file, args.elements)
    rows = {}
    with LocalPool() as pool, GpuSampler() as gpu:
        for cover in (float(c) for c in args.covers.split(",")):
            settings = EvalSettings(compile_baseline=False, launch_cover_us=cover)
            values: dict[str, list[float]] = {"candidate": [], "eager": []}
            spans: dict[str, list[list[float]]] = {"candidate": [], "eager": []}  # each job's fastest and slowest call
            made_of: dict[str, list[dict]] = {"candidate": [], "eager": []}
            calls: dict[str, list[dict]] = {"candidate": [], "eager": []}  # every call's raw data, for later analysis
            for job in range(args.jobs):
                # A fresh baseline cache per job: eager is re-measured every time, like the candidate.
                pool.baselines = BaselineCache(tempfile.mkdtemp())
                with TimingDetails() as caught, \
                        Episode.open(task, language="triton", device="cuda", pool=pool, settings=settings) as episode:
                    episode.workspace.copy_solution(solution)
                    result = episode.evaluate(Mode.PROFILE)
                if not result.correct:
                    print(f"cover {cover:g} us, job {job}: not correct: {result.error or result.violations}", file=sys.stderr)
                    return 1
                for name, timing in (("candidate", result.runtime), ("eager", result.eager)):
                    values[name].append(timing.median_ms)
                    spans[name].append([timing.min_ms * 1e3, timing.max_ms * 1e3])
                    made_of[name].append(summary(caught.runs.get(name), caught.windows.get(name), gpu))
                    calls[name].append(caught.runs.get(name, {}))
                # A job's fastest call tells a job-wide shift (every call slower: placement, clocks) from
                # a share of its calls slowed (host launch past the cover, interference); the details say
                # whether the launch outran the cover or the charge for late work moved.
                slowest = sorted(result.steps_s.items(), key=lambda item: -item[1])[:5]
                print(f"cover {cover:g} us, job {job} ({result.duration_s:.1f} s; "
                      + ", ".join(f"{step} {seconds:.1f}" for step, seconds in slowest) + "):", flush=True)
                for name, timing in (("candidate", result.runtime), ("eager", result.eager)):
                    parts = made_of[name][-1]
                    print(f"    {name:9} {timing.median_ms * 1e3:7.1f} us ({timing.min_ms * 1e3:.1f}-{timing.max_ms * 1e3:.1f})"
                          + "".join(f"  {key} {value}" for key, value in parts.items()), flush=True)
            for name, times in values.items():
                median = statistics.median(times)
                rows[f"{name}, cover {cover:g} us"] = {
                    "launch_cover_us": cover, "median_us": median * 1e3, "min_us": min(times) * 1e3,
                    "max_us": max(times) * 1e3, "spread_pct": (max(times) - min(times)) / median * 100,
                    "do_bench_us": peer[name] * 1e3, "vs_do_bench_pct": (median / peer[name] - 1) * 100,
                    "jobs_us": [t * 1e3 for t in times], "jobs_min_max_us": spans[name], "jobs_made_of": made_of[name],
                    "jobs_calls": calls[name],
                }
    print(f"\n{args.solution}, {args.elements} elements")
    print(f"{'':42} {'median us':>10} {'min':>8} {'max':>8} {'spread %':>9} {'do_bench us':>12} {'vs do_bench %':>14}")
    for name, row in rows.items():
        print(f"{name:42} {row['median_us']:10.1f} {row['min_us']:8.1f} {row['max_us']:8.1f} {row['spread_pct']:9.2f} "
              f"{row['do_bench_us']:12.1f} {row['vs_do_bench_pct']:14.2f}")
    args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "solution": args.solution, "elements": args.elements, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
