"""Many KernelAgent-v0 episodes at once in one process on the CPU: wall time, throughput, memory.

Each episode plays a scripted policy (no model): list the workspace, read SKILL.md and the starter,
write the bundled Triton solution of a tiny relu(x + y) task (4096 elements, Triton's interpreter),
check it with utils/compile.sh, then Finish, which runs the trusted final evaluation (shortened
protocol, no torch.compile baseline). One event loop drives every episode through ``areset`` /
``astep``, as an RL rollout worker or ``kernel-env eval`` does.

Two runs in the same process: a baseline (a few episodes one after another) and the main run (all
episodes at once). Per episode it times the reset, the tool steps and the Finish step (waiting for
the pool, then the final evaluation), and it samples the memory of the whole process tree
(sandboxes, servers and evaluation workers are child processes): the peak of the sum of their
resident sizes, an upper bound (pages shared between processes, such as torch's libraries, count
in each). Prints a table and writes JSON.

    python benchmarks/concurrent_episodes.py --episodes 64 --json concurrent_episodes.json
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

import kernel_env
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.tasks import Task

from _memory import TreeMemory  # benchmarks/_memory.py: run as a script, this folder is on sys.path

TASK = Task(id="bench/relu_add_4k", name="relu_add_4k",
            code=(example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12"))
SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
SETTINGS = EvalSettings(timed_calls=5, min_timed_calls=5, warmup_calls=1, checked_timed_calls=5, compile_baseline=False)
POLICY = [
    {"name": "Bash", "arguments": {"command": "ls -la && head -n 5 SKILL.md"}},
    {"name": "Read", "arguments": {"file_path": "model_new.py"}},
    {"name": "Write", "arguments": {"file_path": "model_new.py", "content": SOLUTION}},
    {"name": "Bash", "arguments": {"command": "bash utils/compile.sh"}},
    {"name": "Finish", "arguments": {"summary": "one fused Triton kernel"}},
]


@dataclass
class EpisodeTimes:
    reset_s: float = 0.0
    tools_s: float = 0.0        # the steps before Finish
    finish_s: float = 0.0       # the Finish step: waiting for the pool, rebuilding, the final evaluation
    evaluation_s: float = 0.0   # of which the harness itself (EvalResult.duration_s)
    correct: bool = False
    reward: float | None = None
    error: str | None = None


async def episode(index: int) -> EpisodeTimes:
    """One scripted episode; a failure is recorded, not raised (the benchmark counts errors)."""
    times = EpisodeTimes()
    env = kernel_env.make("KernelAgent-v0", task=TASK, language="triton", device="cpu", max_turns=len(POLICY) + 5,
                          settings=SETTINGS)
    try:
        started = time.perf_counter()
        await env.areset()
        times.reset_s = time.perf_counter() - started
        started = time.perf_counter()
        for action in POLICY[:-1]:
            _, _, terminated, truncated, info = await env.astep(action)
            problems = [r["output"][:200] for r in info["tool_results"] if r["is_error"]]
            if problems or terminated or truncated:
                raise RuntimeError(f"episode {index}: step {action['name']} went wrong: {problems}")
        times.tools_s = time.perf_counter() - started
        started = time.perf_counter()
        _, reward, terminated, _, info = await env.astep(POLICY[-1])
        times.finish_s = time.perf_counter() - started
        if not terminated:
            raise RuntimeError(f"episode {index}: Finish did not end the episode")
        times.correct, times.reward = bool(info["final"]["correct"]), reward
        times.evaluation_s = env.final.duration_s if env.final is not None else 0.0
        if info["final"]["error"]:
            times.error = info["final"]["error"][:300]
    except Exception as exc:  # noqa: BLE001 - counted and shown
        times.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        await asyncio.to_thread(env.close)
    return times


async def run(count: int, concurrency: int) -> dict:
    slots = asyncio.Semaphore(concurrency)

    async def limited(index: int) -> EpisodeTimes:
        async with slots:
            return await episode(index)

    with TreeMemory() as memory:
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(count)))
        wall = time.perf_counter() - started
    errors = [r.error for r in results if r.error or not r.correct]
    return {
        "episodes": count, "concurrency": concurrency, "wall_s": round(wall, 1),
        "episodes_per_hour": round(3600 * count / wall),
        "errors": len(errors), "error_samples": sorted(set(e or "incorrect" for e in errors))[:3],
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
    parser.add_argument("--episodes", type=int, default=64, help="episodes of the main run, all at once")
    parser.add_argument("--baseline-episodes", type=int, default=4, help="episodes of the baseline, one at a time")
    parser.add_argument("--json", type=Path, default=Path("concurrent_episodes.json"))
    args = parser.parse_args()

    async def both() -> tuple[dict, dict]:
        await episode(-1)  # warm up: the eager baseline cache, Python's imports, the file cache
        return await run(args.baseline_episodes, 1), await run(args.episodes, args.episodes)

    baseline, main_run = asyncio.run(both())
    print(f"{'run':<12}{'episodes':>9}{'wall s':>9}{'eps/hour':>10}{'reset s':>9}{'tools s':>9}{'finish s':>10}"
          f"{'max fin s':>11}{'eval share':>12}{'peak MB':>9}{'procs':>7}{'errors':>8}")
    for name, row in (("sequential", baseline), (f"{args.episodes} at once", main_run)):
        print(f"{name:<12}{row['episodes']:>9}{row['wall_s']:>9}{row['episodes_per_hour']:>10}{row['reset_s_mean']:>9}"
              f"{row['tools_s_mean']:>9}{row['finish_s_mean']:>10}{row['finish_s_max']:>11}"
              f"{row['evaluation_share_of_wall']:>12}{row['peak_tree_rss_mb']:>9}{row['peak_processes']:>7}"
              f"{row['errors']:>8}")
    self_peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(f"peak RSS of this process alone: {self_peak_mb} MB; speed-up of throughput over sequential: "
          f"{main_run['episodes_per_hour'] / baseline['episodes_per_hour']:.2f}x")
    for row in (baseline, main_run):
        for sample in row["error_samples"]:
            print(f"error: {sample}")
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "self_peak_rss_mb": self_peak_mb, "baseline": baseline, "main": main_run}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
