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
  that a job was running, on any of its devices (1.0 on one device: it never waited for work
  while there was some; the ending of a job's processes, which holds its slot, does not count as
  running: ``PoolMeter``);
- on GPUs, the pool's devices' own busy fraction over that same time: NVML's ``utilization.gpu``
  (share of time any kernel ran), sampled by nvidia-smi every 50 ms on each of them, an
  independent account (their mean, and each GPU's in the JSON);
- where the final evaluations ran (``EvalResult.ran_on``: how many on each device);
- on shared GPUs, how the devices' leases spent the run (``DeviceLease.account()``, summed over the
  GPUs, a Ray pool's from its actors): a timing run holding one, a timing run waiting for untimed
  steps to end ("draining"), untimed steps only, idle;
- the share of the machine's processors in use (``/proc/stat``), and where the final evaluations'
  time went on average (``EvalResult.steps_s``, "waiting for the device" included);
- the memory of the whole process tree (sandboxes, servers and evaluation children are child
  processes): the peak of the sum of their resident sizes, an upper bound (shared pages, such as
  torch's libraries, count in each).

    python benchmarks/concurrent_episodes.py --episodes 64 --json concurrent_episodes.json
    python benchmarks/concurrent_episodes.py --device cuda --episodes 32,128,256 --jobs-per-gpu 1,4 --json throughput_gpu.json
    python benchmarks/concurrent_episodes.py --device cuda --episodes 64 --pools local:1,ray:2 --jobs-per-gpu 1,4 --json scale.json

``--jobs-per-gpu 1,4`` runs each count with one job per GPU at a time (the schedule before jobs
shared a GPU) and with four (evaluators/sharing.py), in the same process. ``--elements`` sets the
task's size (``--elements 67108864``: a ~270 us kernel on an H100, against ~20 us at 4M).
``--matmul N`` plays the same policy on another task, an N x N float32 matmul with a tiled Triton
solution (``tasks/matmul``): milliseconds of device work per call, so a job is mostly device work.

``--candidates bundled,eager`` runs each count with each candidate in turn: the bundled Triton
kernel, and the task's own Model as ModelNew (``eager``: judged with ``own_kernels_only`` off, as
benchmarks/kernelbench.py does, so torch may compute). On a GPU each run reports how many episodes
were paid the milestone do_bench's ratios give (``paid_as_do_bench``: Triton's
CUDA graphs (``_gpu.do_bench_times``, "cold_graph": the device's time on cold caches, as
kernel_env's is, without the host's launches) time the candidate, eager and torch.compile in this
process first; the eager candidate's is 1): one kernel, one reward.

``--pools local:1,ray:2`` runs each count through each pool in turn, in the same process: the
local pool on the first GPU, then the Ray pool (``pool="ray"``) on a local Ray cluster given two
GPUs: one actor per GPU running a local pool of it, so ``--jobs-per-gpu`` applies to both. Each Ray
run starts its own cluster and first plays one episode per GPU, so every actor's fork server has
started, as this process's has in the warm-up episode. Every run's episodes per hour are compared with those
of the runs before it of the same count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import resource
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _gpu import (  # benchmarks/_gpu.py and _memory.py: run as a script, this folder is on sys.path
    GpuSampler,
    do_bench_times,
)
from _memory import TreeMemory

import kernel_env
from kernel_env.config import jobs_per_gpu
from kernel_env.evaluators.records import EvalSettings
from kernel_env.evaluators.reward import milestone_reward
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.resources import example_dir
from kernel_env.runtime.pool import SHORT_OF_MEMORY_STEP, GpuPool, LocalPool, RayPool
from kernel_env.tasks import Task

HERE = Path(__file__).resolve().parent
SOLUTION: str
#: Per device: the task's size and the final evaluation's protocol.
SETUPS = {
    "cpu": (1 << 12, EvalSettings.short()),
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


@dataclass(frozen=True)
class PoolSpec:
    """A pool to run episodes through: its kind (local, ray) and how many GPUs it is given (0 on the CPU)."""

    kind: str
    gpus: int

    def label(self, jobs_per_gpu: int) -> str:
        if not self.gpus:
            return f"{self.kind} pool"
        return f"{self.kind} pool, {self.gpus} GPU{'s' if self.gpus > 1 else ''}, {jobs_per_gpu}/GPU"

    def open(self, jobs_per_gpu: int) -> GpuPool:
        if self.kind == "ray":
            return RayPool(init_options={"num_gpus": self.gpus}, jobs_per_gpu=jobs_per_gpu)
        return LocalPool([f"cuda:{i}" for i in range(self.gpus)] or ["cpu"], jobs_per_gpu=jobs_per_gpu)


def candidate_code(candidate: str) -> str:
    """The model_new.py a candidate writes: the bundled solution, or the task's own Model renamed."""
    if candidate == "eager":
        return re.sub(r"\bModel\b", "ModelNew", TASK.code)
    return SOLUTION


def candidate_settings(candidate: str) -> EvalSettings:
    return SETTINGS.model_copy(update={"own_kernels_only": False}) if candidate == "eager" else SETTINGS


def policy(candidate: str = "bundled") -> list[dict]:
    """The scripted episode's actions, writing the configured task's solution."""
    return [
        {"name": "Bash", "arguments": {"command": "ls -la && head -n 5 SKILL.md"}},
        {"name": "Read", "arguments": {"file_path": "model_new.py"}},
        {"name": "Write", "arguments": {"file_path": "model_new.py", "content": candidate_code(candidate)}},
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
    ran_on: str | None = None                 # where it ran: host/device
    error: str | None = None


async def episode(index: int, pool: GpuPool | None = None, candidate: str = "bundled") -> EpisodeTimes:
    """One scripted episode; a failure is recorded, not raised (the benchmark counts errors)."""
    times, actions = EpisodeTimes(), policy(candidate)
    env = kernel_env.make("KernelAgent-v0", task=TASK, language="triton", device=DEVICE, max_turns=len(actions) + 5,
                          settings=candidate_settings(candidate), pool=pool)
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
        times.ran_on = env.final.ran_on if env.final is not None else None
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
    """When each evaluation job was submitted, started, concluded and answered, caught at the pool's
    ``submit`` (so for any pool), from the harness's own account of the job (``EvalResult``), wherever
    it ran. It ran from its start to its conclusion; the ending of its processes (a Ray worker's job
    counts it, as "end children", before its answer; a local pool's comes after the answer) holds its
    slot but evaluates nothing, so it is not counted as running for either."""

    def __init__(self, pool: GpuPool):
        self.pool = pool
        self.jobs: dict[str, tuple[float, float, float, float]] = {}

    def __enter__(self):
        submit = self.pool.submit

        def metered(job):
            submitted = time.monotonic()
            future = submit(job)
            future.add_done_callback(lambda done: self._answered(job.job_id, submitted, done.result()))
            return future

        self.pool.submit = metered
        return self

    def _answered(self, job_id: str, submitted: float, result) -> None:
        answered = time.monotonic()
        started = answered - result.duration_s
        self.jobs[job_id] = (submitted, started, answered - result.steps_s.get("end children", 0.0), answered)

    def __exit__(self, *exc):
        del self.pool.submit  # the class's own again

    def periods(self, running: bool) -> list[tuple[float, float]]:
        """Disjoint intervals in which a job was running (or, with running=False, waiting, running or ending)."""
        spans = sorted((started, concluded) if running else (submitted, answered)
                       for submitted, started, concluded, answered in self.jobs.values())
        merged: list[list[float]] = []
        for begin, end in spans:
            if merged and begin <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([begin, end])
        return [(a, b) for a, b in merged]


def _lease_account(pool: GpuPool) -> dict[str, float]:
    """Seconds the pool's device leases have spent in each state so far, summed over its devices (a
    local pool's, or those in a Ray pool's actors): none where each device runs one job at a time."""
    accounts = list(pool.lease_accounts().values())
    return {state: sum(account[state] for account in accounts) for state in accounts[0]} if accounts else {}


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


async def run(count: int, concurrency: int, jobs_per_gpu: int, spec: PoolSpec, candidate: str = "bundled",
              expected: int | None = None) -> dict:
    slots = asyncio.Semaphore(concurrency)
    evaluator = spec.open(jobs_per_gpu)
    if isinstance(evaluator, RayPool):  # each actor starts its fork server with its first job: one per GPU
        await asyncio.gather(*(episode(-1, evaluator) for _ in range(max(1, spec.gpus))))
    done = 0

    async def limited(index: int) -> EpisodeTimes:
        nonlocal done
        async with slots:
            times = await episode(index, evaluator, candidate)
        done += 1
        if done % max(1, count // 8) == 0 or times.error:
            print(f"  {done}/{count} episodes done; episode {index}: finish {times.finish_s:.1f} s "
                  f"(evaluation {times.evaluation_s:.1f} s){', ' + times.error if times.error else ''}", flush=True)
        return times

    with contextlib.ExitStack() as stack:
        memory, pool = stack.enter_context(TreeMemory()), stack.enter_context(PoolMeter(evaluator))
        gpus = [stack.enter_context(GpuSampler(period_ms=50, index=index)) for index in range(spec.gpus)]
        cpu_before, lease_before, frozen_before = _cpu_ticks(), _lease_account(evaluator), _frozen_counts(evaluator)
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(count)))
        wall = time.perf_counter() - started
        cpu_after, lease_after = _cpu_ticks(), _lease_account(evaluator)
        frozen = {kind: n - frozen_before[kind] for kind, n in _frozen_counts(evaluator).items()}
    evaluator.close()
    if isinstance(evaluator, RayPool):
        import ray

        ray.shutdown()
    spent = {state: seconds - lease_before[state] for state, seconds in lease_after.items()}
    lease_share = {state: round(seconds / max(sum(spent.values()), 1e-9), 3) for state, seconds in spent.items()} or None
    errors = [r.error for r in results if r.error or not r.correct]
    demand = pool.periods(running=False)
    busy = [[s["utilization.gpu"] for begin, end in demand for s in gpu.samples_between(begin, end)] for gpu in gpus]
    samples = [sample for per_gpu in busy for sample in per_gpu]
    return {
        "pool": spec.kind, "gpus": spec.gpus, "candidate": candidate, "expected_reward": expected,
        "paid_as_do_bench": None if expected is None else sum(1 for r in results if r.reward == expected),
        "episodes": count, "concurrency": concurrency, "jobs_per_gpu": jobs_per_gpu, "wall_s": round(wall, 1),
        "episodes_per_hour": round(3600 * count / wall),
        "jobs": len(pool.jobs), "jobs_waiting_or_running_s": round(_length(demand), 1),
        "pool_occupancy": round(_length(pool.periods(running=True)) / max(_length(demand), 1e-9), 3),
        "gpu_busy_fraction": round(statistics.fmean(samples) / 100, 3) if samples else None, "gpu_samples": len(samples),
        "gpu_busy_by_gpu": [round(statistics.fmean(per_gpu) / 100, 3) if per_gpu else None for per_gpu in busy],
        "final_evaluations_by_device": dict(sorted(Counter(r.ran_on.rsplit("/", 1)[1] for r in results if r.ran_on).items())),
        "lease_share": lease_share,
        "freezing_s": round(sum(frozen[part] for part in DeviceLease.FREEZING), 1),
        "freezing_parts_s": {part: round(frozen[part], 1) for part in DeviceLease.FREEZING},
        # Other jobs' children a timing run stopped, and idle judges it held (nothing to stop).
        "children_stopped": frozen["stopped"], "children_held": frozen["held"],
        # Children frozen mid-step (past the lease's grace), and of those inside a call with their worker.
        "frozen_mid_step": frozen["stragglers"], "frozen_in_call": frozen["frozen_in_call"],
        # The same kernel in every episode: how its final times and rewards spread under this load.
        "runtime_ms": _quantiles([r.runtime_ms for r in results if r.runtime_ms is not None]),
        "reward_counts": {str(k): v for k, v in sorted(Counter(r.reward for r in results).items(), key=str)},
        "cpu_busy_fraction": round((cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1), 3),
        "evaluation_steps_s": _mean_steps(results),
        "errors": len(errors), "error_samples": sorted(set(e or "incorrect" for e in errors))[:3],
        "run_again_alone": sum(1 for r in results if r.steps_s and SHORT_OF_MEMORY_STEP in r.steps_s),
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


def _quantiles(values: list[float]) -> dict[str, float] | None:
    """The 10th, 50th and 90th percentiles."""
    if len(values) < 2:
        return {"p10": values[0], "median": values[0], "p90": values[0]} if values else None
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return {"p10": round(deciles[0], 4), "median": round(statistics.median(values), 4), "p90": round(deciles[-1], 4)}


def _frozen_counts(pool: GpuPool) -> dict[str, float]:
    """What the pool's timing runs have spent so far freezing and thawing other jobs' children, in
    seconds by part (``DeviceLease.freezing_s``), and counts: children stopped and held, untimed
    steps frozen mid-step, and children frozen inside a call with their worker (local pools)."""
    leases = list(getattr(pool, "leases", {}).values())
    counts = {part: sum(lease.freezing_s[part] for lease in leases) for part in DeviceLease.FREEZING}
    return counts | {kind: sum(getattr(lease, kind) for lease in leases)
                     for kind in ("stopped", "held", "stragglers", "frozen_in_call")}


def _comparisons(runs: list[tuple[str, dict]]) -> list[dict]:
    """Each run's episodes per hour over those of every run before it of the same count."""
    return [{"run": name, "over": earlier, "ratio": round(row["episodes_per_hour"] / before["episodes_per_hour"], 2)}
            for index, (name, row) in enumerate(runs) for earlier, before in runs[:index]
            if before["episodes"] == row["episodes"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default="64", help="episodes of each main run, all at once (comma-separated counts)")
    parser.add_argument("--baseline-episodes", type=int, default=4, help="episodes of the baseline, one at a time")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--jobs-per-gpu", default=str(jobs_per_gpu()),
                        help="jobs a GPU runs at once (evaluators/sharing.py); comma-separated values "
                             "are each run in turn for every --episodes count, e.g. 1,4 (the CPU always runs one)")
    parser.add_argument("--pools", default="local", metavar="KIND[:GPUS],...",
                        help="the pools each --episodes count runs through, in turn: local or ray (a local Ray cluster, "
                             "an actor per GPU), each given GPUS GPUs (default: every visible one), e.g. local:1,ray:2")
    parser.add_argument("--elements", type=int, help="the task's size (default: 4M on a GPU, 4096 on the CPU); "
                        "a larger one makes each job more device work")
    parser.add_argument("--matmul", type=int, metavar="N", help="an N x N float32 matmul instead of relu(x + y)")
    parser.add_argument("--candidates", default="bundled", help="bundled, eager, or both (comma-separated): what the "
                        "episodes write (eager: the task's own Model as ModelNew)")
    parser.add_argument("--json", type=Path, default=Path("concurrent_episodes.json"))
    args = parser.parse_args()
    configure(args.device, args.elements, args.matmul)
    counts = [int(c) for c in args.episodes.split(",")]
    sharing = [int(j) for j in args.jobs_per_gpu.split(",")] if args.device == "cuda" else [1]
    visible = torch.cuda.device_count() if args.device == "cuda" else 0
    pools = []
    for item in args.pools.split(","):
        kind, _, gpus = item.partition(":")
        if kind not in ("local", "ray") or (gpus and not (gpus.isdigit() and 0 < int(gpus) <= visible)):
            parser.error(f"--pools {item!r}: give local or ray, and on --device cuda at most {visible} GPUs")
        pools.append(PoolSpec(kind, int(gpus) if gpus else visible))

    def write(runs: list[tuple[str, dict]]) -> None:
        """The report so far (after every run: a command cut short by a time limit keeps the runs it finished)."""
        report = {"machine": platform.node(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                  "device": args.device, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                  "task": TASK.name, "self_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "runs": dict(runs), "comparisons": _comparisons(runs[1:])}
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    candidates = args.candidates.split(",")
    if not set(candidates) <= {"bundled", "eager"}:
        parser.error("--candidates: bundled, eager or both")
    expected = {candidate: None for candidate in candidates}
    if args.device == "cuda":
        peers = do_bench_times(TASK.code, SOLUTION)
        peer, margin = peers["cold_graph"], SETTINGS.speedup_margin  # the device's time on cold caches, as kernel_env's
        expected = {"bundled": milestone_reward(True, peer["candidate"], peer["eager"], peer["compile"], margin), "eager": 1}
        for kind, times in peers.items():
            print(f"{kind}: candidate {times['candidate'] * 1e3:.1f} us, eager {times['eager'] * 1e3:.1f} us, torch.compile "
                  f"{times['compile'] * 1e3:.1f} us", flush=True)
        print(f"the bundled kernel's milestone by the cold graphs' times: {expected['bundled']}", flush=True)

    async def all_runs() -> list[tuple[str, dict]]:
        await episode(-1)  # warm up: the baseline cache, Python's imports, the file cache
        runs = [("sequential", await run(args.baseline_episodes, 1, 1, PoolSpec("local", min(visible, 1)), candidates[0],
                                         expected[candidates[0]]))]
        write(runs)
        for count in counts:
            for spec in pools:
                for jobs in sharing:
                    for candidate in candidates:
                        name = f"{count} at once, {spec.label(jobs)}" + (f", {candidate}" if len(candidates) > 1 else "")
                        runs.append((name, await run(count, count, jobs, spec, candidate, expected[candidate])))
                        row = runs[-1][1]
                        print(f"{name}: {row['wall_s']} s, {row['episodes_per_hour']} episodes/hour, {row['errors']} wrong, "
                              f"rewards {row['reward_counts']}", flush=True)
                        write(runs)
        return runs

    runs = asyncio.run(all_runs())
    print(f"{args.device}, {TASK.name}:")
    width = max(len(name) for name, _ in runs) + 2
    print(f"{'run':<{width}}{'episodes':>9}{'wall s':>9}{'eps/hour':>10}{'reset s':>9}{'tools s':>9}{'finish s':>10}"
          f"{'max fin s':>11}{'pool occ':>10}{'gpu busy':>10}{'peak MB':>9}{'procs':>7}{'errors':>8}")
    for name, row in runs:
        busy = "-" if row["gpu_busy_fraction"] is None else f"{row['gpu_busy_fraction']:.3f}"
        print(f"{name:<{width}}{row['episodes']:>9}{row['wall_s']:>9}{row['episodes_per_hour']:>10}{row['reset_s_mean']:>9}"
              f"{row['tools_s_mean']:>9}{row['finish_s_mean']:>10}{row['finish_s_max']:>11}{row['pool_occupancy']:>10.3f}"
              f"{busy:>10}{row['peak_tree_rss_mb']:>9}{row['peak_processes']:>7}{row['errors']:>8}")
    self_peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    sequential = runs[0][1]["episodes_per_hour"]
    print(f"peak RSS of this process alone: {self_peak_mb} MB; throughput over sequential: "
          + ", ".join(f"{name} {row['episodes_per_hour'] / sequential:.2f}x" for name, row in runs[1:]))
    for comparison in _comparisons(runs[1:]):
        print(f"{comparison['run']} over {comparison['over']}: {comparison['ratio']:.2f}x episodes/hour")
    for name, row in runs:
        lease = ", ".join(f"{state} {share:.0%}" for state, share in (row["lease_share"] or {}).items()) or "-"
        devices = ", ".join(f"{device} {jobs}" for device, jobs in row["final_evaluations_by_device"].items())
        print(f"{name}: processors busy {row['cpu_busy_fraction']:.0%}; GPU lease: {lease}; "
              f"jobs run again alone, short of device memory: {row['run_again_alone']}; final evaluations on: {devices}; "
              f"frozen mid-step {row['frozen_mid_step']} (inside a call {row['frozen_in_call']})")
        print("  final evaluation, mean s: " + ", ".join(f"{step} {s}" for step, s in row["evaluation_steps_s"].items()))
        times = row["runtime_ms"] or {}
        paid = "" if row["expected_reward"] is None else \
            f" ({row['paid_as_do_bench']}/{row['episodes']} paid {row['expected_reward']}, do_bench's milestone)"
        print(f"  the candidate's final time, ms: median {times.get('median')} (p10 {times.get('p10')}, p90 {times.get('p90')}); "
              f"rewards {row['reward_counts']}{paid}")
        parts = ", ".join(f"{part} {s} s" for part, s in row["freezing_parts_s"].items())
        print(f"  freezing and thawing children {row['freezing_s']} s ({parts}); children stopped "
              f"{row['children_stopped']}, idle judges held {row['children_held']}")
    for _, row in runs:
        for sample in row["error_samples"]:
            print(f"error: {sample}")
    write(runs)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
