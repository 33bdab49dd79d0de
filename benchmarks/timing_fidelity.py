"""Timing fidelity: one kernel evaluated in N separate jobs, and agreement with do_bench.

For a fused Triton relu(x + y) on 16M float32 elements (about 190 MB moved per call, ~60 us on an
H100) and for the eager PyTorch baseline, runs N independent evaluation jobs through the local pool
and reports the spread of the medians, (max - min) / median, next to Triton's do_bench and
do_bench_cudagraph for the same callables measured in this process: the independent peers (the
first times each call with events around its launch; the second replays a CUDA graph of many
calls, the kernel's time without any launch). Each job's line says what its time was made of:
the judge's clock for the whole call and the calibrated round trip taken out of it
(docs/design.md, The trusted evaluation).

``--elements 1048576`` is the small-kernel case (~10 us), where the round trip's noise matters most.

    python benchmarks/timing_fidelity.py [--jobs 6] [--elements N] [--solution NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.records import EvalSettings, Mode
from kernel_env.runtime.episode import Episode
from kernel_env.runtime.pool import LocalPool
from kernel_env.tasks import Task

HERE = Path(__file__).resolve().parent
TASK_CODE = (HERE.parent / "examples" / "relu_add" / "task.py").read_text()
SOLUTIONS = HERE.parent / "tests" / "gpu" / "solutions"


def peers(kernel_file: Path, elements: int) -> dict[str, dict[str, float]]:
    """do_bench and do_bench_cudagraph medians (ms) of the candidate and of eager, in this process."""
    import triton.testing

    spec = importlib.util.spec_from_file_location(kernel_file.stem, kernel_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # Triton needs the kernel's source file
    model = module.ModelNew().cuda()
    x, y = torch.randn(elements, device="cuda"), torch.randn(elements, device="cuda")
    calls = {"candidate": lambda: model(x, y), "eager": lambda: torch.relu(x + y)}
    found = {}
    for name, call in calls.items():
        found[name] = {"do_bench": triton.testing.do_bench(call, return_mode="median")}
        with torch.cuda.stream(torch.cuda.Stream()):
            found[name]["do_bench_cudagraph"] = triton.testing.do_bench_cudagraph(call, return_mode="median")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
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
    peer = peers(kernel_file, args.elements)
    settings = EvalSettings(compile_baseline=False)
    values: dict[str, list[float]] = {"candidate": [], "eager": []}
    jobs: dict[str, list[dict]] = {"candidate": [], "eager": []}
    with LocalPool() as pool:
        for job in range(args.jobs):
            pool.baselines = BaselineCache(tempfile.mkdtemp())  # eager is measured again in every job, like the candidate
            with Episode.open(task, language="triton", device="cuda", pool=pool, settings=settings) as episode:
                episode.workspace.copy_solution(solution)
                result = episode.evaluate(Mode.PROFILE)
            if not result.correct:
                print(f"job {job}: not correct: {result.error or result.violations}", file=sys.stderr)
                return 1
            line = []
            for name, timing in (("candidate", result.runtime), ("eager", result.eager)):
                values[name].append(timing.median_ms)
                jobs[name].append(timing.model_dump())
                line.append(f"{name} {timing.median_ms * 1e3:7.1f} us ({timing.min_ms * 1e3:.1f}-{timing.max_ms * 1e3:.1f}, "
                            f"round trip {timing.round_trip_ms * 1e3:.1f} us taken out)")
            print(f"job {job} ({result.duration_s:.1f} s): " + "; ".join(line), flush=True)
    rows = {}
    for name, times in values.items():
        median = statistics.median(times)
        rows[name] = {"median_us": median * 1e3, "min_us": min(times) * 1e3, "max_us": max(times) * 1e3,
                      "spread_pct": (max(times) - min(times)) / median * 100,
                      **{f"{peer_name}_us": ms * 1e3 for peer_name, ms in peer[name].items()},
                      **{f"vs_{peer_name}_pct": (median / ms - 1) * 100 for peer_name, ms in peer[name].items()},
                      "jobs": jobs[name]}
    device = torch.cuda.get_device_name()
    print(f"\n{args.solution}, {args.elements} elements, {args.jobs} jobs, {device}")
    print(f"{'':10} {'median us':>10} {'min':>8} {'max':>8} {'spread %':>9} {'do_bench us':>12} {'vs %':>7} "
          f"{'cudagraph us':>13} {'vs %':>7}")
    for name, row in rows.items():
        print(f"{name:10} {row['median_us']:10.1f} {row['min_us']:8.1f} {row['max_us']:8.1f} {row['spread_pct']:9.2f} "
              f"{row['do_bench_us']:12.1f} {row['vs_do_bench_pct']:7.1f} {row['do_bench_cudagraph_us']:13.1f} "
              f"{row['vs_do_bench_cudagraph_pct']:7.1f}")
    args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "solution": args.solution,
                                     "elements": args.elements, "jobs": args.jobs, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
