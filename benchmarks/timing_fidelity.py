"""Timing fidelity: one kernel evaluated in N separate jobs, and agreement with do_bench.

For a fused Triton relu(x + y) on float32 inputs (16M elements: about 190 MB moved per call, ~55 us
on an H200) runs N independent evaluation jobs through the local pool, each with an empty baseline
cache (so torch.compile is compiled and timed in every job too), and reports per model (the
candidate, eager, torch.compile) the median of the jobs' medians, their spread (max - min) /
median, and the same callables' times by independent peers in this process (``_gpu.do_bench_times``):
Triton's ``do_bench`` (events around each call: a small kernel's time holds its host launches) and
"cold graph" (CUDA graphs of an L2 flush and the call, less the flush's: the device's time on cold
caches, what kernel_env measures by design, since a call is queued ahead of its start). And the
one ratio a reward decides on, candidate / eager (and candidate / torch.compile), per job, against
the peers'.

Each job's line says what its candidate time was made of (docs/design.md, One call, and the
clock): eager's own time in the judge's process, plus the candidate's calls through its worker
(``raw``, the whole call) less the task's Model's calls through the same worker (``yardstick``).

    python benchmarks/timing_fidelity.py [--jobs 6] [--elements 16777216 4194304 1048576] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from _gpu import do_bench_times  # benchmarks/_gpu.py: run as a script, this folder is on sys.path

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.records import EvalSettings, Mode
from kernel_env.runtime.episode import Episode
from kernel_env.runtime.pool import LocalPool
from kernel_env.tasks import Task

HERE = Path(__file__).resolve().parent
TASK_CODE = (HERE.parent / "examples" / "relu_add" / "task.py").read_text()
SOLUTIONS = HERE.parent / "tests" / "gpu" / "solutions"
MODELS = ("candidate", "eager", "compile")


def size(pool: LocalPool, elements: int, jobs: int, solution: Path) -> dict:
    """``jobs`` evaluations of the solution on relu(x + y) of ``elements``, and do_bench's times beside."""
    code = TASK_CODE.replace("1 << 24", str(elements))
    task = Task(id=f"bench/relu_add_{elements}", code=code, source="synthetic")
    peers = do_bench_times(code, (solution / "model_new.py").read_text())
    values: dict[str, list[float]] = {name: [] for name in MODELS}
    records = []
    for job in range(jobs):
        pool.baselines = BaselineCache(tempfile.mkdtemp())  # torch.compile compiled and timed in every job
        with Episode.open(task, language="triton", device="cuda", pool=pool, settings=EvalSettings()) as episode:
            episode.workspace.copy_solution(solution)
            result = episode.evaluate(Mode.PROFILE)
        if not result.correct:
            raise SystemExit(f"{elements} elements, job {job}: not correct: {result.error or result.violations}")
        runtime = result.runtime
        for name, timing in zip(MODELS, (runtime, result.eager, result.compiled_baseline)):
            values[name].append(timing.median_ms)
        records.append({"reward": result.reward, "close_calls": result.close_calls, "seconds": result.duration_s,
                        **{name: t.model_dump() for name, t in zip(MODELS, (runtime, result.eager, result.compiled_baseline))}})
        print(f"{elements} job {job} ({result.duration_s:.1f} s): candidate {runtime.median_ms * 1e3:.1f} us "
              f"(+-{runtime.sem_ms * 1e3:.2f}: raw {runtime.raw_ms * 1e3:.1f} - yardstick "
              f"{runtime.yardstick_raw_ms * 1e3:.1f} + eager {result.eager_ms * 1e3:.1f}; drift {runtime.drift:+.2%}), "
              f"compile {result.compile_ms * 1e3:.1f} us, reward {result.reward}", flush=True)
    rows = {}
    for name, times in values.items():
        median = statistics.median(times)
        rows[name] = {"median_us": median * 1e3, "min_us": min(times) * 1e3, "max_us": max(times) * 1e3,
                      "spread_pct": (max(times) - min(times)) / median * 100}
        for peer, found in peers.items():
            rows[name][f"{peer}_us"] = found[name] * 1e3
            rows[name][f"vs_{peer}_pct"] = (median / found[name] - 1) * 100
    ratios = {}
    for baseline in ("eager", "compile"):
        ours = [c / b for c, b in zip(values["candidate"], values[baseline])]
        ratios[f"candidate_over_{baseline}"] = row = {"median": statistics.median(ours), "min": min(ours), "max": max(ours)}
        for peer, found in peers.items():
            theirs = found["candidate"] / found[baseline]
            row.update({peer: theirs, f"vs_{peer}_pct": (statistics.median(ours) / theirs - 1) * 100,
                        f"worst_vs_{peer}_pct": max(abs(r / theirs - 1) for r in ours) * 100})
    return {"elements": elements, "rows": rows, "ratios": ratios, "jobs": records,
            "rewards": sorted(r["reward"] for r in records)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--elements", type=int, nargs="+", default=[1 << 24], help="elements of x and y (default 16M)")
    parser.add_argument("--solution", default="turn4_fused", help="the candidate: a file of tests/gpu/solutions, without .py")
    parser.add_argument("--json", type=Path, default=Path("timing_fidelity.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("timing_fidelity needs a CUDA GPU", file=sys.stderr)
        return 2
    solution = Path(tempfile.mkdtemp()) / "solution"
    solution.mkdir()
    (solution / "model_new.py").write_text((SOLUTIONS / f"{args.solution}.py").read_text())
    with LocalPool() as pool:
        sizes = [size(pool, elements, args.jobs, solution) for elements in args.elements]
    device = torch.cuda.get_device_name()
    print(f"\n{args.solution}, {args.jobs} jobs, {device}, torch {torch.__version__}")
    print(f"{'elements':>9} {'model':10} {'median us':>10} {'min':>8} {'max':>8} {'spread %':>9} {'do_bench us':>12} {'vs %':>7} "
          f"{'cold graph us':>13} {'vs %':>7}")
    for found in sizes:
        for name, row in found["rows"].items():
            print(f"{found['elements']:>9} {name:10} {row['median_us']:10.1f} {row['min_us']:8.1f} {row['max_us']:8.1f} "
                  f"{row['spread_pct']:9.2f} {row['do_bench_us']:12.1f} {row['vs_do_bench_pct']:7.1f} "
                  f"{row['cold_graph_us']:13.1f} {row['vs_cold_graph_pct']:7.1f}")
    print(f"\n{'elements':>9} {'ratio':24} {'median':>8} {'min':>8} {'max':>8} {'do_bench':>9} {'vs %':>7} {'worst %':>8} "
          f"{'cold graph':>10} {'vs %':>7} {'worst %':>8}  rewards")
    for found in sizes:
        for name, ratio in found["ratios"].items():
            print(f"{found['elements']:>9} {name:24} {ratio['median']:8.3f} {ratio['min']:8.3f} {ratio['max']:8.3f} "
                  f"{ratio['do_bench']:9.3f} {ratio['vs_do_bench_pct']:7.1f} {ratio['worst_vs_do_bench_pct']:8.1f} "
                  f"{ratio['cold_graph']:10.3f} {ratio['vs_cold_graph_pct']:7.1f} {ratio['worst_vs_cold_graph_pct']:8.1f}  "
                  f"{found['rewards']}")
    args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "solution": args.solution,
                                     "jobs": args.jobs, "sizes": sizes}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
