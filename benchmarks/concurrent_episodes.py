"""Many KernelAgent-v0 episodes at once in one process: wall time, throughput, memory, device use.

Each episode plays a scripted policy (no model): list the workspace, read SKILL.md and the starter,
write the bundled Triton solution of relu(x + y), check it with utils/compile.sh, then Finish, which
runs the trusted final evaluation. One event loop drives every episode through ``areset`` /
``astep``, as an RL rollout worker or ``kernel-env eval`` does. On the CPU (Triton's interpreter)
the task has 4096 elements and the protocol is shortened; on a GPU it has 4M elements and the
final evaluation is the full default protocol (the eager and torch.compile baselines come from
the cache, filled by a warm-up episode).

Runs in the same process: a baseline (a few episodes one after another), then one main run per
``--episodes`` count (all of that many at once). Per episode it times the reset, the tool steps
and the Finish step (waiting for the pool, then the final evaluation). Per run it reports:

- episodes per hour;
- the pool's occupancy: the share of the time in which evaluation jobs were waiting or running
  that a job was running (1.0: the device never waited for work while there was some);
- on a GPU, the device's own busy fraction over that same time: NVML's ``utilization.gpu``
  (share of time any kernel ran), sampled by nvidia-smi every 50 ms, an independent account;
- on a shared GPU, how the device's lease spent the run (``DeviceLease.account()``): a timing run
  holding it, a timing run waiting for untimed steps to end ("draining"), untimed steps only, idle;
- the share of the machine's processors in use (``/proc/stat``), and where the final evaluations'
  time went on average (``EvalResult.steps_s``, "waiting for the device" included);
- the memory of the whole process tree (sandboxes, servers and evaluation children are child
  processes): the peak of the sum of their resident sizes, an upper bound (shared pages, such as
  torch's libraries, count in each).

    python benchmarks/concurrent_episodes.py --episodes 64 --json concurrent_episodes.json
    python benchmarks/concurrent_episodes.py --device cuda --episodes 32,128,256 --jobs-per-gpu 1,4 --json throughput_gpu.json

``--jobs-per-gpu 1,4`` runs each count with one job per GPU at a time (the schedule before jobs
shared a GPU) and with four (evaluators/sharing.py), in the same process. ``--elements`` sets the
task's size (``--elements 67108864``: a ~270 us kernel on an H100, against ~20 us at 4M).
``--matmul N`` plays the same policy on another task, an N x N float32 matmul with a tiled Triton
solution (``tasks/matmul``): milliseconds of device work per call, so a job is mostly device work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _gpu import (
    GpuSampler,  # benchmarks/_gpu.py and _memory.py: run as a script, this folder is on sys.path
)
from _memory import TreeMemory

import kernel_env
import kernel_env.runtime.pool
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.tasks import Task

HERE = Path(__file__).resolve().parent
SOLUTION: str
#: Per device: the task's size and the final evaluation's protocol.
SETUPS = {
    "cpu": (1 << 12, EvalSettings(timed_calls=5, min_timed_calls=5, warmup_calls=1, checked_timed_calls=5,
                                  compile_baseline=False)),
    "cuda": (1 << 22, EvalSettings()),
}
DEVICE = "cpu"
TASK: Task
SETTINGS: EvalSettings


def configure(device: str, elements: int | None = None, matmul: int | None = None) -> None:
    global DEVICE, TASK, SETTINGS, SOLUTION
    default, SETTINGS = SETUPS[device]
    DEVICE = device
    if matmul:
        SOLUTION = (HERE / "tasks" / "matmul" / "model_new.py").read_text()
        TASK = Task(id=f"bench/matmul_{matmul}", name=f"matmul_{matmul}",
                    code=(HERE / "tasks" / "matmul" / "task.py").read_text().replace("N = 4096", f"N = {matmul}"))
        return
    elements = elements or default
    SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
    TASK = Task(id=f"bench/relu_add_{elements}", name=f"relu_add_{elements}",
                code=(example_dir() / "task.py").read_text().replace("1 << 24", str(elements)))


def policy() -> list[dict]:
    """The scripted episode's actions, writing the configured task's solution."""
    return [
        {"name": "Bash", "arguments": {"command": "ls -la && head -n 5 SKILL.md"}},
        {"name": "Read", "arguments": {"file_path": "model_new.py"}},
        {"name": "Write", "arguments": {"file_path": "model_new.py", "content": SOLUTION}},
        {"name": "Bash", "arguments": {"command": "bash utils/compile.sh"}},
        {"name": "Finish", "arguments": {"summary": "one Triton kernel"}},
    ]


@dataclass
class EpisodeTimes:
    reset_s: float = 0.0
    tools_s: float = 0.0        # the steps before Finish
    finish_s: float = 0.0       # the Finish step: waiting for the pool, rebuilding, the final evaluation
    evaluation_s: float = 0.0   # of which the harness itself (EvalResult.duration_s)
    correct: bool = False
    reward: float | None = None
    runtime_ms: float | None = None           # the final evaluation's times, so a reward that differs
    speedup_vs_compile: float | None = None   # between episodes of the same kernel says why
    steps_s: dict[str, float] | None = None   # the final evaluation's own account
    error: str | None = None


async def episode(index: int, pool: kernel_env.runtime.pool.GpuPool | None = None) -> EpisodeTimes:
    """One scripted episode; a failure is recorded, not raised (the benchmark counts errors)."""
    times, actions = EpisodeTimes(), policy()
    env = kernel_env.make("KernelAgent-v0", task=TASK, language="triton", device=DEVICE, max_turns=len(actions) + 5,
                          settings=SETTINGS, pool=pool)
    try:
        started = time.perf_counter()
        await env.areset()
        times.reset_s = time.perf_counter() - started
        started = time.perf_counter()
        for action in actions[:-1]:
            _, _, terminated, truncated, info = await env.astep(action)
            problems = [r["output"][:200] for r in info["tool_results"] if r["is_error"]]
            if problems or terminated or truncated:
                raise RuntimeError(f"episode {index}: step {action['name']} went wrong: {problems}")
        times.tools_s = time.perf_counter() - started
        started = time.perf_counter()
        _, reward, terminated, _, info = await env.astep(actions[-1])
        times.finish_s = time.perf_counter() - started
        if not terminated:
            raise RuntimeError(f"episode {index}: Finish did not end the episode")
        times.correct, times.reward = bool(info["final"]["correct"]), reward
        times.evaluation_s = env.final.duration_s if env.final is not None else 0.0
        times.steps_s = dict(env.final.steps_s) if env.final is not None else None
        times.runtime_ms = info["final"].get("runtime_ms")
        times.speedup_vs_compile = info["final"].get("speedup_vs_compile")
        if not times.correct and env.final is not None:  # why, in full: an honest kernel judged wrong is a bug
            times.error = " | ".join(filter(None, [env.final.error, *env.final.violations,
                                                   *(t.message for t in env.final.trials if not t.correct)]))[:1000] or "incorrect"
        elif info["final"]["error"]:
            times.error = info["final"]["error"][:300]
    except Exception as exc:  # noqa: BLE001 - counted and shown
        times.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        await asyncio.to_thread(env.close)
    return times


class PoolMeter:
    """When each evaluation job was submitted, started and ended (the local pool's, caught on the way)."""

    def __init__(self):
        self.jobs: dict[str, list[float]] = {}
        self._submit, self._evaluate = kernel_env.runtime.pool.LocalPool.submit, kernel_env.runtime.pool.evaluate

    def __enter__(self):
        meter = self

        def submit(pool, job):
            meter.jobs[job.job_id] = [time.monotonic(), 0.0, 0.0]
            return meter._submit(pool, job)

        def evaluate(job, **options):
            meter.jobs[job.job_id][1] = time.monotonic()
            try:
                return meter._evaluate(job, **options)
            finally:
                meter.jobs[job.job_id][2] = time.monotonic()

        kernel_env.runtime.pool.LocalPool.submit, kernel_env.runtime.pool.evaluate = submit, evaluate
        return self

    def __exit__(self, *exc):
        kernel_env.runtime.pool.LocalPool.submit, kernel_env.runtime.pool.evaluate = self._submit, self._evaluate

    def periods(self, running: bool) -> list[tuple[float, float]]:
        """Disjoint intervals in which a job was running (or, with running=False, waiting or running)."""
        spans = sorted((start if running else submitted, end) for submitted, start, end in self.jobs.values() if end)
        merged: list[list[float]] = []
        for begin, end in spans:
            if merged and begin <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([begin, end])
        return [(a, b) for a, b in merged]


def _length(periods) -> float:
    return sum(end - begin for begin, end in periods)


def _cpu_ticks() -> tuple[int, int]:
    """The machine's processor time so far (busy, total), in clock ticks, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def _mean_steps(results: list[EpisodeTimes], top: int = 10) -> dict[str, float]:
    """The final evaluations' steps, mean seconds per evaluation, largest first."""
    accounts = [r.steps_s for r in results if r.steps_s]
    names = {name for account in accounts for name in account}
    means = {name: sum(a.get(name, 0.0) for a in accounts) / len(accounts) for name in names}
    return {name: round(seconds, 3) for name, seconds in sorted(means.items(), key=lambda kv: -kv[1])[:top]}


async def run(count: int, concurrency: int, jobs_per_gpu: int) -> dict:
    slots = asyncio.Semaphore(concurrency)
    evaluator = kernel_env.runtime.pool.LocalPool(jobs_per_gpu=jobs_per_gpu)
    done = 0

    async def limited(index: int) -> EpisodeTimes:
        nonlocal done
        async with slots:
            times = await episode(index, evaluator)
        done += 1
        if done % max(1, count // 8) == 0 or times.error:
            print(f"  {done}/{count} episodes done; episode {index}: finish {times.finish_s:.1f} s "
                  f"(evaluation {times.evaluation_s:.1f} s){', ' + times.error if times.error else ''}", flush=True)
        return times

    lease = next(iter(evaluator.leases.values()), None)  # the first GPU's: the episodes run on cuda:0
    with TreeMemory() as memory, PoolMeter() as pool, GpuSampler(period_ms=50) as gpu:
        cpu_before, lease_before = _cpu_ticks(), lease.account() if lease else {}
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(count)))
        wall = time.perf_counter() - started
        cpu_after, lease_after = _cpu_ticks(), lease.account() if lease else {}
    evaluator.close()
    spent = {state: seconds - lease_before[state] for state, seconds in lease_after.items()}
    lease_share = {state: round(seconds / max(sum(spent.values()), 1e-9), 3) for state, seconds in spent.items()} or None
    errors = [r.error for r in results if r.error or not r.correct]
    demand = pool.periods(running=False)
    busy = [s["utilization.gpu"] for begin, end in demand for s in gpu.samples_between(begin, end)] if DEVICE == "cuda" else []
    return {
        "episodes": count, "concurrency": concurrency, "jobs_per_gpu": jobs_per_gpu, "wall_s": round(wall, 1),
        "episodes_per_hour": round(3600 * count / wall),
        "jobs": len(pool.jobs), "jobs_waiting_or_running_s": round(_length(demand), 1),
        "pool_occupancy": round(_length(pool.periods(running=True)) / max(_length(demand), 1e-9), 3),
        "gpu_busy_fraction": round(statistics.fmean(busy) / 100, 3) if busy else None, "gpu_samples": len(busy),
        "lease_share": lease_share,
        "cpu_busy_fraction": round((cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1), 3),
        "evaluation_steps_s": _mean_steps(results),
        "errors": len(errors), "error_samples": sorted(set(e or "incorrect" for e in errors))[:3],
        "run_again_alone": sum(1 for r in results if r.steps_s and kernel_env.runtime.pool.SHORT_OF_MEMORY_STEP in r.steps_s),
        "reset_s_mean": _mean(r.reset_s for r in results), "tools_s_mean": _mean(r.tools_s for r in results),
        "finish_s_mean": _mean(r.finish_s for r in results), "finish_s_max": round(max(r.finish_s for r in results), 2),
        "evaluation_s_total": round(sum(r.evaluation_s for r in results), 1),
        "evaluation_share_of_wall": round(sum(r.evaluation_s for r in results) / wall, 2),
        "peak_tree_rss_mb": round(memory.peak_bytes / 2**20), "peak_processes": memory.peak_processes,
        "rewards": sorted({r.reward for r in results if r.reward is not None}),
        "per_episode": [asdict(r) for r in results],
    }


def _mean(values) -> float:
    return round(statistics.fmean(values), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default="64", help="episodes of each main run, all at once (comma-separated counts)")
    parser.add_argument("--baseline-episodes", type=int, default=4, help="episodes of the baseline, one at a time")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--jobs-per-gpu", default=str(kernel_env.runtime.pool.default_jobs_per_gpu()),
                        help="jobs a GPU runs at once (evaluators/sharing.py); comma-separated values are each run in turn "
                             "for every --episodes count, e.g. 1,4 (the CPU always runs one)")
    parser.add_argument("--elements", type=int, help="the task's size (default: 4M on a GPU, 4096 on the CPU); "
                        "a larger one makes each job more device work")
    parser.add_argument("--matmul", type=int, metavar="N", help="an N x N float32 matmul instead of relu(x + y)")
    parser.add_argument("--json", type=Path, default=Path("concurrent_episodes.json"))
    args = parser.parse_args()
    configure(args.device, args.elements, args.matmul)
    counts = [int(c) for c in args.episodes.split(",")]
    sharing = [int(j) for j in args.jobs_per_gpu.split(",")] if args.device == "cuda" else [1]

    def write(runs: list[tuple[str, dict]]) -> None:
        """The report so far (after every run: a command cut short by a time limit keeps the runs it finished)."""
        report = {"machine": platform.node(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                  "device": args.device, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                  "task": TASK.name, "self_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "runs": dict(runs)}
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    async def all_runs() -> list[tuple[str, dict]]:
        await episode(-1)  # warm up: the baseline cache, Python's imports, the file cache
        runs = [("sequential", await run(args.baseline_episodes, 1, 1))]
        write(runs)
        for count in counts:
            for jobs in sharing:
                name = f"{count} at once" + (f", {jobs}/GPU" if args.device == "cuda" else "")
                runs.append((name, await run(count, count, jobs)))
                row = runs[-1][1]
                print(f"{name}: {row['wall_s']} s, {row['episodes_per_hour']} episodes/hour, {row['errors']} wrong", flush=True)
                write(runs)
        return runs

    runs = asyncio.run(all_runs())
    print(f"{args.device}, {TASK.name}:")
    print(f"{'run':<22}{'episodes':>9}{'wall s':>9}{'eps/hour':>10}{'reset s':>9}{'tools s':>9}{'finish s':>10}"
          f"{'max fin s':>11}{'pool occ':>10}{'gpu busy':>10}{'peak MB':>9}{'procs':>7}{'errors':>8}")
    for name, row in runs:
        busy = "-" if row["gpu_busy_fraction"] is None else f"{row['gpu_busy_fraction']:.3f}"
        print(f"{name:<22}{row['episodes']:>9}{row['wall_s']:>9}{row['episodes_per_hour']:>10}{row['reset_s_mean']:>9}"
              f"{row['tools_s_mean']:>9}{row['finish_s_mean']:>10}{row['finish_s_max']:>11}{row['pool_occupancy']:>10.3f}"
              f"{busy:>10}{row['peak_tree_rss_mb']:>9}{row['peak_processes']:>7}{row['errors']:>8}")
    self_peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    sequential = runs[0][1]["episodes_per_hour"]
    print(f"peak RSS of this process alone: {self_peak_mb} MB; throughput over sequential: "
          + ", ".join(f"{name} {row['episodes_per_hour'] / sequential:.2f}x" for name, row in runs[1:]))
    for name, row in runs:
        lease = ", ".join(f"{state} {share:.0%}" for state, share in (row["lease_share"] or {}).items()) or "-"
        print(f"{name}: processors busy {row['cpu_busy_fraction']:.0%}; GPU lease: {lease}; "
              f"jobs run again alone, short of device memory: {row['run_again_alone']}")
        print("  final evaluation, mean s: " + ", ".join(f"{step} {s}" for step, s in row["evaluation_steps_s"].items()))
    for _, row in runs:
        for sample in row["error_samples"]:
            print(f"error: {sample}")
    write(runs)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
