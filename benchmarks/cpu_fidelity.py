"""Timing fidelity on the CPU: one C++ kernel evaluated in N jobs, against its own times in this process.

The bundled C++ solution of relu(x + y) (examples/relu_add/solutions/cpp: one fused OpenMP loop) is
built once in an episode's sandbox, then evaluated in ``--jobs`` jobs (``Mode.PROFILE``; the
baselines cache filled by the first). Its peer: the same built module's ``ModelNew``, the task's
``Model`` and ``torch.compile`` of it, timed here in one process as the judge times a baseline
(``Reference.timed_call``'s CPU path: fresh inputs, a 32 MiB cache flush, the process's clock around
the forward; torch's threads as the worker has them). Per model it reports the median of the jobs'
times, their spread (max - min) / median, and the in-process time; then the ratio a reward decides
on, candidate / eager, per job against the in-process one, the rewards, and the milestone the
in-process times give.

What the rows read (docs/performance.md, The CPU clock): the rewards should be the in-process
milestone's in every job, and the ratio near the in-process one. (The evaluation's children get an
environment of their own, ``forkserver.child_env``: a variable set for this process, such as
``OMP_WAIT_POLICY``, changes the in-process peer only.)

    python benchmarks/cpu_fidelity.py [--jobs 6] [--elements 1048576] [--json cpu_fidelity.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from kernel_env.config import DEFAULT_SPEEDUP_MARGIN
from kernel_env.evaluators.records import Mode
from kernel_env.evaluators.reward import milestone_reward
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import Episode
from kernel_env.tasks import Task

MODELS = ("candidate", "eager", "compile")
FLUSH_BYTES = 32 << 20  # the harness's flush on the CPU (harness._Script._flush_bytes)


def in_process(task: Task, workspace: Path, calls: int = 200, warmup: int = 20) -> dict[str, float]:
    """Median ms per call of the built ModelNew, the Model and torch.compile of it, in this process."""
    namespace: dict = {}
    exec(compile(task.code, "task.py", "exec"), namespace)  # noqa: S102 - the bundled example task
    sys.path[:0] = [str(workspace / "build"), str(workspace)]
    model_new = importlib.import_module("model_new")
    models = {"candidate": model_new.ModelNew(), "eager": namespace["Model"]()}
    models["compile"] = torch.compile(models["eager"])
    flush = torch.zeros(FLUSH_BYTES, dtype=torch.uint8)
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for index in range(warmup + calls):
            inputs = namespace["get_inputs"]()
            for name, model in models.items():  # alternating, so a change of pace meets all three alike
                flush.bitwise_not_()
                began = time.perf_counter_ns()
                model(*inputs)
                if index >= warmup:
                    times[name].append((time.perf_counter_ns() - began) / 1e6)
    return {name: statistics.median(found) for name, found in times.items()}


def size(elements: int, jobs: int) -> dict:
    code = (example_dir() / "task.py").read_text().replace("1 << 24", str(elements))
    task = Task(id=f"bench/relu_add_{elements}", code=code, source="synthetic")
    values: dict[str, list[float]] = {name: [] for name in MODELS}
    records = []
    with Episode.open(task, language="cpp", device="cpu") as episode:
        episode.workspace.copy_solution(example_dir() / "solutions" / "cpp")
        built = episode.compile()
        if built.exit_code != 0:
            raise SystemExit(f"the bundled cpp solution did not build: {built.output[-2000:]}")
        for job in range(jobs):
            result = episode.evaluate(Mode.PROFILE)
            if not result.correct:
                raise SystemExit(f"{elements} elements, job {job}: not correct: {result.error or result.violations}")
            timings = dict(zip(MODELS, (result.runtime, result.eager, result.compiled_baseline)))
            for name, timing in timings.items():
                values[name].append(timing.median_ms)
            records.append({"reward": result.reward, "close_calls": result.close_calls, "seconds": result.duration_s,
                            **{name: t.model_dump() for name, t in timings.items()}})
            print(f"{elements} job {job} ({result.duration_s:.1f} s): candidate {result.runtime.median_ms:.3f} ms "
                  f"(+-{result.runtime.sem_ms:.3f}), eager {result.eager_ms:.3f}, compile {result.compile_ms:.3f}, "
                  f"reward {result.reward}", flush=True)
        peer = in_process(task, episode.workspace.path)
    rows = {}
    for name, times in values.items():
        median = statistics.median(times)
        rows[name] = {"median_ms": median, "min_ms": min(times), "max_ms": max(times),
                      "spread_pct": (max(times) - min(times)) / median * 100, "in_process_ms": peer[name],
                      "vs_in_process_pct": (median / peer[name] - 1) * 100}
    ours = [c / e for c, e in zip(values["candidate"], values["eager"])]
    expected = milestone_reward(True, peer["candidate"], peer["eager"], peer["compile"], DEFAULT_SPEEDUP_MARGIN)
    return {"elements": elements, "rows": rows, "jobs": records, "rewards": [r["reward"] for r in records],
            "in_process_milestone": expected,
            "candidate_over_eager": {"median": statistics.median(ours), "min": min(ours), "max": max(ours),
                                     "in_process": peer["candidate"] / peer["eager"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--elements", type=int, nargs="+", default=[1 << 20], help="elements of x and y (default 1M)")
    parser.add_argument("--json", type=Path, default=Path("cpu_fidelity.json"))
    args = parser.parse_args()
    sizes = [size(elements, args.jobs) for elements in args.elements]
    policy = os.environ.get("OMP_WAIT_POLICY", "(unset)")
    print(f"\nbundled cpp relu(x + y), {args.jobs} jobs, {os.cpu_count()} processors, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY {policy}")
    print(f"{'elements':>9} {'model':10} {'median ms':>10} {'min':>8} {'max':>8} {'spread %':>9} {'in process ms':>14} {'vs %':>7}")
    for found in sizes:
        for name, row in found["rows"].items():
            print(f"{found['elements']:>9} {name:10} {row['median_ms']:10.3f} {row['min_ms']:8.3f} {row['max_ms']:8.3f} "
                  f"{row['spread_pct']:9.1f} {row['in_process_ms']:14.3f} {row['vs_in_process_pct']:7.1f}")
    print(f"\n{'elements':>9} {'candidate / eager':>18} {'min':>7} {'max':>7} {'in process':>11}  rewards  (in-process milestone)")
    for found in sizes:
        ratio = found["candidate_over_eager"]
        print(f"{found['elements']:>9} {ratio['median']:18.3f} {ratio['min']:7.3f} {ratio['max']:7.3f} {ratio['in_process']:11.3f}  "
              f"{found['rewards']}  ({found['in_process_milestone']})")
    args.json.write_text(json.dumps({"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                                     "omp_wait_policy": policy, "jobs": args.jobs, "sizes": sizes}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
