"""Episodes per hour through ``kernel-env serve`` against in-process KernelAgent-v0, on the same
machine in the same run.

Each episode plays the same scripted policy (no model): list the workspace, read the starter,
write the bundled solution of relu(x + y) for the language, run utils/compile.sh, Finish (the
trusted final evaluation). In-process, one event loop drives every episode through ``areset`` /
``astep``, as an RL rollout worker does; served, the same loop drives them through openenv-core's
``GenericEnvClient``, one WebSocket session each, against a ``kernel-env serve`` started here as
a subprocess with the same task, language, device and protocol (its own pool: a server process
holds the pool, as the rollout process does in-process). Each mode first plays one episode
alone (its pool's fork server, the imports, the baseline cache) and times a step that does
almost nothing (``Bash true``, one after another: the protocol's own cost per step); then the
rounds: in each, ``--episodes`` at once in-process, then as many through the server. A shared
machine's load drifts, so compare the modes within a round.

On the CPU the default is Triton (its interpreter: no compiler in the loop) on 4096 elements with
a shortened protocol; ``--language cpp`` builds a C++ extension in every episode.

    python benchmarks/serve_throughput.py --episodes 8 --json serve_throughput.json
    python benchmarks/serve_throughput.py --language cuda --device cuda --episodes 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

from openenv.core import GenericEnvClient

import kernel_env
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.tasks import Task, resolve_task

#: Per device: the task's size and the protocol (the CPU's shortened, as the tests'; a GPU's the default).
SETUPS = {
    "cpu": (1 << 12, EvalSettings.short()),
    "cuda": (1 << 22, EvalSettings()),
}


def policy(language: str) -> list[dict]:
    """The scripted episode's tool calls: the language's bundled solution, built, then Finish."""
    solution = example_dir() / "solutions" / language
    writes = [{"name": "Write",
               "arguments": {"file_path": str(path.relative_to(solution)), "content": path.read_text()}}
              for path in sorted(solution.rglob("*")) if path.is_file()]
    return [{"name": "Bash", "arguments": {"command": "ls -la && head -n 5 SKILL.md"}},
            {"name": "Read", "arguments": {"file_path": "model_new.py"}},
            *writes,
            {"name": "Bash", "arguments": {"command": "bash utils/compile.sh"}},
            {"name": "Finish", "arguments": {}}]


class InProcess:
    """An episode of KernelAgent-v0 in this process (this process's shared pool)."""

    def __init__(self, task: Task, language: str, device: str, settings: EvalSettings):
        self.env = kernel_env.make("KernelAgent-v0", task=task, language=language, device=device, settings=settings)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.env.close)

    async def reset(self) -> None:
        await self.env.areset()

    async def step(self, call: dict) -> tuple[float, bool, dict]:
        _, reward, terminated, truncated, info = await self.env.astep(call)
        return reward, terminated or truncated, info


class Served:
    """An episode through the server: one WebSocket session of openenv-core's client."""

    def __init__(self, url: str):
        self.client = GenericEnvClient(base_url=url, message_timeout_s=3600)

    async def __aenter__(self) -> Self:
        await self.client.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()

    async def reset(self) -> None:
        await self.client.reset()

    async def step(self, call: dict) -> tuple[float, bool, dict]:
        result = await self.client.step({"tool_calls": [call]})
        return result.reward, result.done, result.observation["info"]


@dataclass
class EpisodeTimes:
    reset_s: float = 0.0
    tools_s: float = 0.0    # the steps before Finish
    finish_s: float = 0.0   # Finish: the clean rebuild and the final evaluation
    reward: float | None = None
    error: str | None = None


async def episode(open_episode, actions: list[dict]) -> EpisodeTimes:
    """One scripted episode; a failure is recorded, not raised (the table counts errors)."""
    times = EpisodeTimes()
    try:
        async with open_episode() as env:
            started = time.perf_counter()
            await env.reset()
            times.reset_s = time.perf_counter() - started
            started = time.perf_counter()
            for call in actions[:-1]:
                _, done, info = await env.step(call)
                problems = [r["output"][:200] for r in info["tool_results"] if r["is_error"]]
                if problems or done:
                    raise RuntimeError(f"step {call['name']} went wrong: {problems}")
            times.tools_s = time.perf_counter() - started
            started = time.perf_counter()
            times.reward, done, info = await env.step(actions[-1])
            times.finish_s = time.perf_counter() - started
            if not info["final"]["correct"]:
                times.error = f"final evaluation: {info['final']['error'] or 'incorrect'}"[:300]
    except Exception as exc:  # noqa: BLE001 - counted and shown
        times.error = f"{type(exc).__name__}: {exc}"[:300]
    return times


async def step_round_trip(open_episode, steps: int) -> float:
    """Mean milliseconds of a ``Bash true`` step, one after another in one episode."""
    async with open_episode() as env:
        await env.reset()
        started = time.perf_counter()
        for _ in range(steps):
            await env.step({"name": "Bash", "arguments": {"command": "true"}})
        return 1000 * (time.perf_counter() - started) / steps


async def warm_up(open_episode, actions: list[dict], steps: int) -> float:
    """One episode alone (the pool's fork server, the imports, the baseline cache), then the step
    round trip (``step_round_trip``)."""
    warm = await episode(open_episode, actions)
    if warm.error:
        raise RuntimeError(f"the warm-up episode failed: {warm.error}")
    return await step_round_trip(open_episode, steps)


async def run(open_episode, actions: list[dict], count: int) -> dict:
    """``count`` episodes at once."""
    started = time.perf_counter()
    results = await asyncio.gather(*(episode(open_episode, actions) for _ in range(count)))
    wall = time.perf_counter() - started
    errors = [r.error for r in results if r.error]
    return {"episodes": count, "wall_s": round(wall, 1), "episodes_per_hour": round(3600 * count / wall),
            "reset_s_mean": _mean(r.reset_s for r in results), "tools_s_mean": _mean(r.tools_s for r in results),
            "finish_s_mean": _mean(r.finish_s for r in results), "errors": len(errors),
            "error_samples": sorted(set(errors))[:3],
            "rewards": sorted({r.reward for r in results if r.reward is not None}),
            "per_episode": [asdict(r) for r in results]}


def _mean(values) -> float:
    return round(statistics.fmean(values), 2)


def start_server(task_file: Path, language: str, device: str, settings: EvalSettings, sessions: int, log: Path):
    """``kernel-env serve`` on a free port, and its address once it listens."""
    argv = [sys.executable, "-m", "kernel_env.cli", "serve", "--port", "0", "--task", str(task_file),
            "--language", language, "--device", device, "--max-sessions", str(sessions),
            "--settings", settings.model_dump_json()]
    with log.open("w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = process.stdout.readline()
    if " listening on " not in line:
        process.kill()
        raise RuntimeError(f"kernel-env serve did not start: {line!r}\n{log.read_text()[-3000:]}")
    return process, line.split(" listening on ")[1].split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="episodes of each mode's main run, all at once")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--language", choices=("triton", "cpp", "cuda"), default="triton")
    parser.add_argument("--elements", type=int, help="the task's size (default: 4096 on the CPU, 4M on a GPU)")
    parser.add_argument("--rounds", type=int, default=2, help="main runs of each mode, alternating (a shared machine's "
                        "load drifts: compare within a round)")
    parser.add_argument("--round-trip-steps", type=int, default=20, help="Bash true steps timed in each mode")
    parser.add_argument("--json", type=Path, default=Path("serve_throughput.json"))
    args = parser.parse_args()
    default_elements, settings = SETUPS[args.device]
    actions = policy(args.language)

    with tempfile.TemporaryDirectory(prefix="serve-throughput-") as folder:
        elements = args.elements or default_elements
        task_file = Path(folder) / f"relu_add_{elements}.py"
        task_file.write_text((example_dir() / "task.py").read_text().replace("1 << 24", str(elements)))
        task = resolve_task(str(task_file))
        log = Path(folder) / "server.log"
        server, url = start_server(task_file, args.language, args.device, settings, args.episodes + 1, log)
        modes = {"in-process": lambda: InProcess(task, args.language, args.device, settings),
                 "kernel-env serve": lambda: Served(url)}
        try:
            round_trip = {name: asyncio.run(warm_up(opener, actions, args.round_trip_steps))
                          for name, opener in modes.items()}
            rounds = []
            for index in range(args.rounds):
                rounds.append({})
                for name, opener in modes.items():
                    rounds[-1][name] = row = asyncio.run(run(opener, actions, args.episodes))
                    print(f"round {index + 1}, {name}: {row['wall_s']} s, {row['episodes_per_hour']} episodes/hour, "
                          f"{row['errors']} errors", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            exit_code = server.wait(timeout=300)
        if exit_code != 0:
            raise RuntimeError(f"kernel-env serve exited {exit_code} after SIGTERM:\n{log.read_text()[-3000:]}")

    ratios = [round(r["kernel-env serve"]["episodes_per_hour"] / r["in-process"]["episodes_per_hour"], 2)
              for r in rounds]
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "device": args.device, "language": args.language, "task": task.name, "episodes": args.episodes,
              "step_round_trip_ms": {name: round(ms, 1) for name, ms in round_trip.items()}, "rounds": rounds,
              "served_over_in_process": ratios}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.language} on {args.device}, {task.name}, {args.episodes} episodes at once, {args.rounds} round(s):")
    print(f"{'round':<7}{'mode':<18}{'wall s':>8}{'eps/hour':>10}{'reset s':>9}{'tools s':>9}{'finish s':>10}"
          f"{'errors':>8}")
    for index, runs in enumerate(rounds, start=1):
        for name, row in runs.items():
            print(f"{index:<7}{name:<18}{row['wall_s']:>8}{row['episodes_per_hour']:>10}{row['reset_s_mean']:>9}"
                  f"{row['tools_s_mean']:>9}{row['finish_s_mean']:>10}{row['errors']:>8}")
    print("served / in-process, episodes per hour: " + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
          + f" (median {statistics.median(ratios):.2f}x)")
    print("a Bash true step, one after another: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in round_trip.items()))
    for runs in rounds:
        for row in runs.values():
            for sample in row["error_samples"]:
                print(f"error: {sample}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
