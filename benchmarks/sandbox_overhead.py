"""What a sandbox costs an episode: reset() latency and Bash-step overhead, local (bubblewrap) vs docker.

reset: create a workspace (template + task + SKILL.md, protected) and start its sandbox until
the server answers, as ``Episode.open`` does (the broker and pool are left out: they are the
same for both backends). close: stop the sandbox (everything in it dies). Bash step: one
``exec("true")`` in a started sandbox (a fresh bash that restores and saves the shell state:
what every Bash tool call pays), and the same through the Bash tool of a ToolBox. Medians and
90th percentiles over N; prints a table and writes JSON.

    python benchmarks/sandbox_overhead.py --resets 20 --steps 200 --json sandbox_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from kernel_env.sandbox import BACKENDS, SandboxError, make_sandbox
from kernel_env.tasks import resolve_task
from kernel_env.tools import ToolBox, ToolCall
from kernel_env.workspace import Workspace


def _summary(seconds: list[float]) -> dict:
    ms = sorted(1000 * s for s in seconds)
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 2),
            "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 2), "min_ms": round(ms[0], 2)}


def measure(backend: str, root: Path, resets: int, steps: int) -> dict:
    task = resolve_task("example/relu_add")
    reset, close = [], []
    for _ in range(resets + 1):  # the first one warms caches (and builds docker's image): not counted
        started = time.perf_counter()
        workspace = Workspace.create(task, "cpp", root=root)
        sandbox = make_sandbox(backend, workspace)
        sandbox.start()
        ready = time.perf_counter()
        sandbox.close()
        closed = time.perf_counter()
        workspace.destroy()
        reset.append(ready - started)
        close.append(closed - ready)

    workspace = Workspace.create(task, "cpp", root=root)
    exec_true, bash_tool = [], []
    with make_sandbox(backend, workspace) as sandbox:
        box = ToolBox(sandbox)
        for _ in range(5):
            sandbox.exec("true")
        for _ in range(steps):
            started = time.perf_counter()
            sandbox.exec("true")
            exec_true.append(time.perf_counter() - started)
        for _ in range(steps):
            started = time.perf_counter()
            box.run(ToolCall(name="Bash", arguments={"command": "true"}))
            bash_tool.append(time.perf_counter() - started)
    workspace.destroy()
    return {"reset": _summary(reset[1:]), "close": _summary(close[1:]), "exec_true": _summary(exec_true),
            "bash_tool_true": _summary(bash_tool)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--json", type=Path, default=Path("sandbox_overhead.json"))
    args = parser.parse_args()

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as root:
        for backend in args.backends:
            try:
                results[backend] = measure(backend, Path(root), args.resets, args.steps)
            except SandboxError as exc:
                results[backend] = {"error": str(exc)}

    header = f"{'backend':<8} {'reset median':>13} {'reset p90':>10} {'close median':>13} {'Bash true median':>17} {'p90':>8} {'Bash tool median':>17}"
    print(header)
    print("-" * len(header))
    for backend, r in results.items():
        if "error" in r:
            print(f"{backend:<8} cannot run here: {r['error']}")
            continue
        print(f"{backend:<8} {r['reset']['median_ms']:>10.1f} ms {r['reset']['p90_ms']:>7.1f} ms {r['close']['median_ms']:>10.1f} ms "
              f"{r['exec_true']['median_ms']:>14.2f} ms {r['exec_true']['p90_ms']:>5.2f} ms {r['bash_tool_true']['median_ms']:>14.2f} ms")
    record = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "resets": args.resets, "steps": args.steps, "results": results}
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
