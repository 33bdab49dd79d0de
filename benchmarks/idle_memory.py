"""The memory one idle KernelAgent-v0 episode costs on this host, with the local (bubblewrap) sandbox.

An idle episode: ``reset()`` has returned the agent's first observation (workspace created,
sandbox started and answering, the broker serving the episode's socket) and nothing runs in it.
In one process, on the CPU:

1. warm-up: one episode opened and closed, so the one-off state every later episode shares
   exists before the baseline (torch and the rest of kernel_env imported, the shared pool), then
   a wait until no process is left below this one (one-off background work it started);
2. baseline: the memory of this process and everything below it, no episode open;
3. N/4 episodes opened at once (``areset`` on one event loop, as a rollout worker opens them),
   then the rest up to N; after each, a settle time and a measurement;
4. every episode closed, a last measurement, and a check that no process, workspace or broker
   thread is left (exit code 1 otherwise).

A measurement is ``gc.collect()``, then the median of a few readings one second apart of the
PSS and RSS of every process of the tree (benchmarks/_memory.py): this driver, bubblewrap (two
per sandbox: the launcher and the pid namespace's init), the sandbox servers, and anything else
(evaluation children, pool workers: none while idle).

Per episode: (PSS with N open - baseline) / N, where PSS is the tree's less the driver's
file-backed pages. Those are torch's and Python's libraries: every other process on the host
that maps the same files (another Python on this virtualenv's torch) takes a share of them, so
the driver's file PSS moves by tens of MB with other work. Episodes only lower it a little: an
episode's server shares Python and libc with the driver and takes its share of them into its own
PSS, so leaving the driver's out errs high, by that share. The table keeps the whole tree's
figure too (tree PSS/ep). Split: the driver's
anonymous growth and the sandbox processes' PSS; the slope between the two points is the cost of
one more episode, without the one-off costs of the first ones. RSS alongside, an upper bound
(shared pages count in every process). PSS leaves out the kernel's own memory for each sandbox
(namespaces, mounts, pipes, page tables, kernel stacks): "kernel/ep" is the growth of the host's
Slab + KernelStack + PageTables, which other work moves too (the JSON also has the host's
MemAvailable, noisier still). 1 MB = 2**20 bytes. Prints two tables and writes JSON.

    python benchmarks/idle_memory.py --episodes 32 --json idle_memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

import kernel_env
from kernel_env.sandbox.client import SANDBOX_SERVER, SERVER

from _memory import ProcessMemory, meminfo, threads, tree_memory  # benchmarks/_memory.py

TARGET_MB = 30.0
MB = 2**20
SANDBOX_KINDS = ("bubblewrap", "sandbox server")
#: The kernel's own memory in /proc/meminfo that a sandbox adds to (namespaces, mounts, pipes,
#: sockets: slab; its processes' page tables and kernel stacks); the host's, so other work moves it too.
KERNEL_FIELDS = ("Slab", "KernelStack", "PageTables")
FIELDS = ("pss", "rss", "pss_anon", "pss_file", "pss_shmem")


def kind_of(process: ProcessMemory) -> str:
    """Which part of the tree a process is: the driver, bubblewrap, a sandbox server, or other (named)."""
    if process.pid == os.getpid():
        return "driver"
    program = os.path.basename(process.argv[0]) if process.argv else "?"
    if program == "bwrap":
        return "bubblewrap"
    if process.argv and process.argv[-1] in (SANDBOX_SERVER, str(SERVER)):
        return "sandbox server"
    return f"other: {program}"


def measure(episodes: int, samples: int) -> dict:
    """The tree's memory now: totals, per kind of process, the driver's threads, the host's kernel
    memory (the median of ``samples`` readings by ``attributable_pss``)."""
    gc.collect()
    readings = []
    for index in range(samples):
        if index:
            time.sleep(1.0)
        tree, host = tree_memory(), meminfo()
        kinds: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("count", *FIELDS), 0))
        for process in tree:
            row = kinds[kind_of(process)]
            row["count"] += 1
            for field in FIELDS:
                row[field] += getattr(process, field)
        readings.append({
            "episodes": episodes, "processes": len(tree), "driver_threads": threads(os.getpid()),
            "tree_pss": sum(p.pss for p in tree), "tree_rss": sum(p.rss for p in tree),
            "host_kernel": sum(host[name] for name in KERNEL_FIELDS), "host_mem_available": host["MemAvailable"],
            "kinds": dict(sorted(kinds.items())),
        })
    readings.sort(key=attributable_pss)
    return readings[len(readings) // 2]


def attributable_pss(point: dict) -> int:
    """The tree's PSS without the driver's file-backed pages (torch's and Python's libraries):
    any other process on the host that maps the same files takes a share of them, so their PSS
    moves with other work. Episodes lower it only by their servers' share of Python and libc,
    which counts in the servers' PSS: leaving it out errs high, by that share."""
    driver = point["kinds"]["driver"]
    return point["tree_pss"] - driver["pss_file"]


def per_episode(point: dict, base: dict) -> dict:
    """What each open episode adds over the baseline, in MB."""
    n = point["episodes"]

    def kind(name: str, field: str, point: dict = point) -> int:
        return point["kinds"].get(name, {}).get(field, 0)

    def others(point: dict) -> int:
        return sum(row["pss"] for name, row in point["kinds"].items() if name.startswith("other"))

    return {key: round(value / n / MB, 2) for key, value in {
        "pss": attributable_pss(point) - attributable_pss(base),
        "rss": point["tree_rss"] - base["tree_rss"],
        "tree_pss": point["tree_pss"] - base["tree_pss"],
        "driver_anon": kind("driver", "pss_anon") - kind("driver", "pss_anon", base),
        "driver_file": kind("driver", "pss_file") - kind("driver", "pss_file", base),
        "sandbox_pss": sum(kind(name, "pss") for name in SANDBOX_KINDS),
        "other_pss": others(point) - others(base),
        "host_kernel": point["host_kernel"] - base["host_kernel"],
        "host_mem_available_drop": base["host_mem_available"] - point["host_mem_available"],
    }.items()}


async def open_episodes(count: int, task: str, language: str) -> list:
    """``count`` environments reset at once; each returned its first observation."""
    envs = [kernel_env.make("KernelAgent-v0", task=task, language=language, device="cpu") for _ in range(count)]
    observations = await asyncio.gather(*(env.areset() for env in envs))
    for env, (prompt, info) in zip(envs, observations):
        if not prompt or not Path(info["workspace_host_path"]).is_dir():
            raise SystemExit(f"reset of {task} returned no prompt or no workspace: {info}")
    return envs


async def wait_for_quiet(timeout: float) -> None:
    """Wait until this process has no child left; exit naming them if that takes over ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while len(others := [p for p in tree_memory() if kind_of(p) != "driver"]) > 0:
        if time.monotonic() > deadline:
            names = sorted({" ".join(p.argv)[:120] for p in others})
            raise SystemExit(f"processes still running {timeout:.0f} s after the warm-up episode closed: {names}")
        await asyncio.sleep(1.0)


async def run(args: argparse.Namespace) -> dict:
    warm = (await open_episodes(1, args.task, args.language))[0]
    isolated = getattr(warm.episode.sandbox, "isolated", None)
    warm.close()
    # One-off background work the first episode may start (precompiling headers) must end before
    # the baseline, or its process would count in the baseline and not in the points, or the reverse.
    await wait_for_quiet(args.quiet_timeout)
    baseline = measure(0, args.samples)

    envs, points = [], []
    for target in sorted({args.first, args.episodes}):
        opened = time.perf_counter()
        envs += await open_episodes(target - len(envs), args.task, args.language)
        open_s = time.perf_counter() - opened
        await asyncio.sleep(args.settle)
        points.append(measure(len(envs), args.samples) | {"open_s": round(open_s, 2)})

    workspaces = [env.episode.workspace.root for env in envs]
    for env in envs:
        env.close()
    def broker_threads() -> int:
        return sum(t.name.startswith("kernel_env-broker-") for t in threading.enumerate())

    deadline = time.monotonic() + 10  # a sandbox's processes (and a broker's thread) may take a moment to end
    while True:
        closed = measure(0, 1)
        if (closed["processes"] == 1 and not broker_threads()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    left = {"processes": sorted(name for name in closed["kinds"] if name != "driver"),
            "workspaces": [str(path) for path in workspaces if path.exists()],
            "broker_threads": broker_threads()}
    return {"isolated": isolated, "baseline": baseline, "points": points, "closed": closed, "left_behind": left}


def _mb(value: int) -> str:
    return f"{value / MB:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32, help="idle episodes open at the main point")
    parser.add_argument("--first", type=int, default=None, help="episodes open at the first point (default: N/4)")
    parser.add_argument("--task", default="example/relu_add")
    parser.add_argument("--language", default="cpp", choices=("cpp", "triton", "cuda"))
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between opening and measuring")
    parser.add_argument("--samples", type=int, default=3, help="readings per measurement (the median counts)")
    parser.add_argument("--quiet-timeout", type=float, default=600.0,
                        help="seconds to wait for one-off background work of the warm-up episode to end")
    parser.add_argument("--json", type=Path, default=Path("idle_memory.json"))
    args = parser.parse_args()
    args.first = args.first or max(1, args.episodes // 4)
    if not 0 < args.first <= args.episodes:
        parser.error(f"--first must be between 1 and --episodes ({args.episodes}), got {args.first}")

    result = asyncio.run(run(args))
    base, points, closed = result["baseline"], result["points"], result["closed"]
    for point in points:
        point["per_episode_mb"] = per_episode(point, base)
    slope = None
    if len(points) == 2:
        low, high = points
        added = high["episodes"] - low["episodes"]
        slope = {"pss": round((attributable_pss(high) - attributable_pss(low)) / added / MB, 2),
                 "rss": round((high["tree_rss"] - low["tree_rss"]) / added / MB, 2),
                 "tree_pss": round((high["tree_pss"] - low["tree_pss"]) / added / MB, 2)}
    main_point = points[-1]

    if not result["isolated"]:
        print("warning: bubblewrap could not run here: the sandboxes were NOT isolated (no bwrap processes)")
    print(f"Idle KernelAgent-v0 episodes ({args.task}, {args.language}, local sandbox). MB; PSS: the tree's, "
          f"less the driver's file pages; /ep: per open episode, over the baseline")
    header = (f"{'point':<14}{'eps':>4}{'procs':>6}{'threads':>8}{'PSS':>8}{'RSS':>8}{'PSS/ep':>8}{'RSS/ep':>8}"
              f"{'driver/ep':>10}{'sandbox/ep':>11}{'kernel/ep':>10}{'tree PSS/ep':>12}")
    print(header)
    print("-" * len(header))
    rows = [("baseline", base), *((f"{p['episodes']} open", p) for p in points), ("after close", closed)]
    for name, row in rows:
        each = row.get("per_episode_mb")
        cells = (f"{each['pss']:>8.2f}{each['rss']:>8.2f}{each['driver_anon']:>10.2f}{each['sandbox_pss']:>11.2f}"
                 f"{each['host_kernel']:>10.2f}{each['tree_pss']:>12.2f}") if each else ""
        print(f"{name:<14}{row['episodes']:>4}{row['processes']:>6}{row['driver_threads']:>8}"
              f"{_mb(attributable_pss(row)):>8}{_mb(row['tree_rss']):>8}{cells}")
    if slope:
        print(f"{'slope ' + str(points[0]['episodes']) + '->' + str(points[1]['episodes']):<14}{'':>34}"
              f"{slope['pss']:>8.2f}{slope['rss']:>8.2f}{'':>31}{slope['tree_pss']:>12.2f}")
    print("driver/ep: the driver's anonymous PSS; sandbox/ep: bubblewrap and the server; kernel/ep: the host's\n"
          "Slab + KernelStack + PageTables; tree PSS/ep: with the driver's file pages (moves with other work)")

    n = main_point["episodes"]
    header = (f"{'process (' + str(n) + ' open)':<22}{'count':>6}{'PSS each':>10}{'anon':>8}{'file':>8}{'RSS each':>10}"
              f"{'PSS/ep':>9}")
    print()
    print(header)
    print("-" * len(header))
    for name, row in main_point["kinds"].items():
        count = row["count"]
        share = "" if name == "driver" else f"{row['pss'] / n / MB:>9.2f}"  # the driver's is not per episode
        print(f"{name:<22}{count:>6}{_mb(row['pss'] / count):>10}{_mb(row['pss_anon'] / count):>8}"
              f"{_mb(row['pss_file'] / count):>8}{_mb(row['rss'] / count):>10}{share}")
    driver = base["kinds"]["driver"]
    print(f"{'driver at baseline':<22}{1:>6}{_mb(driver['pss']):>10}{_mb(driver['pss_anon']):>8}"
          f"{_mb(driver['pss_file']):>8}{_mb(driver['rss']):>10}")

    cost = main_point["per_episode_mb"]["pss"]
    verdict = "met" if cost <= TARGET_MB else "NOT met"
    print(f"\nper idle episode: {cost:.2f} MB PSS ({main_point['per_episode_mb']['rss']:.2f} MB RSS) with {n} open; "
          f"target <= {TARGET_MB:.0f} MB: {verdict}")
    print(f"after closing every episode the tree holds {_mb(attributable_pss(closed) - attributable_pss(base))} MB "
          f"PSS and {_mb(closed['tree_rss'] - base['tree_rss'])} MB RSS more than at the baseline")
    left = result["left_behind"]
    for process in left["processes"]:
        print(f"error: a process was left after every episode closed: {process}")
    for workspace in left["workspaces"]:
        print(f"error: a workspace was left after its episode closed: {workspace}")
    if left["broker_threads"]:
        print(f"error: {left['broker_threads']} broker accept threads were left after every episode closed")

    report = {"machine": {"node": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "torch": torch.__version__,
                          "load_average": os.getloadavg(), "argv": sys.argv},
              "task": args.task, "language": args.language, "settle_s": args.settle, "samples": args.samples,
              "target_mb": TARGET_MB, "per_episode_mb": main_point["per_episode_mb"], "slope_mb": slope,
              "target_met": cost <= TARGET_MB} | result
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    if left["processes"] or left["workspaces"] or left["broker_threads"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
