"""What an evaluation child costs to get ready: forked by the fork server against a fresh interpreter.

"Ready" is what a spare is before its job comes: its imports done and, on a GPU, its CUDA
context made and the harness's Triton kernels loaded. Two ways, in the same run, with the same
isolation (bubblewrap where it works):

- fork server (``children.Child.spawn(..., preload=True)``, what the pool does now), timed to the
  answer of its first command;
- fresh interpreter (the peer, what a spare was before the fork server): bubblewrap starting
  ``python -I -B`` that imports the runner and its modules and readies the same kernels, timed
  to its exit.

Each is run ``--counts`` at once (the pool starts two per job, and more when jobs pile up), with
wall time to the last one ready and the CPU time the children used (from /proc/<pid>/stat of
forked children and their wardens; what a fresh interpreter reports of itself as it ends). The fork
server's own start (its imports, once per process and kind) is reported apart.

    python benchmarks/child_start.py --counts 1,8 --repeat 3 --json child_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from kernel_env.evaluators import children, forkserver
from kernel_env.evaluators.child.protocol import Setup
from kernel_env.sandbox.bwrap import (
    base_argv,
    bubblewrap_problem,
    gpu_device_binds,
    python_executable,
)

_TICK = os.sysconf("SC_CLK_TCK")
_IMPORTS = ("import sys; sys.path.insert(0, {dir!r}); import runner, guards, timing; "
            "guards.preload(); timing.preload(); import resource; r = resource.getrusage(resource.RUSAGE_SELF); "
            "print(r.ru_utime + r.ru_stime)")


def _child_env(device: str) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": "0" if device == "cuda" else ""}


def fresh_interpreters(count: int, device: str) -> tuple[float, float]:
    """``count`` fresh interpreters at once, each importing and readying what a spare did: (wall s, CPU s)."""
    python, gpu = python_executable(), device == "cuda"
    env = {"PATH": f"{Path(python).parent}:/usr/bin:/bin", "HOME": "/tmp/home", "TMPDIR": "/tmp",
           "LANG": "C.UTF-8", **_child_env(device)}
    folder = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
    if bubblewrap_problem() is None:
        argv = base_argv(folder, extra_ro_binds=()) + (gpu_device_binds() if gpu else [])
        argv += ["--ro-bind", str(forkserver.CHILD_DIR), "/run/kernel_env/child", "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        argv += [python, "-I", "-B", "-c", _IMPORTS.format(dir="/run/kernel_env/child")]
    else:
        argv = [python, "-I", "-B", "-c", _IMPORTS.format(dir=str(forkserver.CHILD_DIR))]
    started = time.monotonic()
    procs = [subprocess.Popen(argv, env={**os.environ, **env} if bubblewrap_problem() else {"PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, text=True) for _ in range(count)]
    outputs = [proc.communicate()[0] for proc in procs]
    wall = time.monotonic() - started
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"a fresh interpreter failed: exit codes {[proc.returncode for proc in procs]}")
    return wall, sum(float(output.split()[-1]) for output in outputs)  # each interpreter's own CPU time


def _cpu_seconds(pid: int) -> float:
    """CPU time of a forked child and of its warden (its parent, which made its namespaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    warden = Path(f"/proc/{fields[1]}/stat").read_text().rpartition(")")[2].split()
    return sum(int(f[11]) + int(f[12]) for f in (fields, warden)) / _TICK


def forked_children(count: int, device: str) -> tuple[float, float]:
    """``count`` children forked at once, each made ready as a spare is: (wall s, CPU s)."""
    made: list[children.Child] = []
    lock = threading.Lock()

    def start() -> None:
        child = children.Child.spawn("judge", env=_child_env(device), gpu=device == "cuda", label="bench",
                                      preload=True)
        child.call(Setup(device="cuda:0" if device == "cuda" else "cpu", out_dir=child.path("/job/ref"),
                         task_code="import torch\n"), None, 300)
        with lock:
            made.append(child)

    started = time.monotonic()
    threads = [threading.Thread(target=start) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    if len(made) != count:
        raise SystemExit("a forked child failed to start")
    cpu = sum(_cpu_seconds(child.proc.pid) for child in made)
    for child in made:
        child.discard()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,8", help="children started at once, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, default=Path("child_start.json"))
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]

    started = time.monotonic()
    forkserver.zygote_for(_child_env(args.device), gpu=args.device == "cuda")
    server_start = time.monotonic() - started
    print(f"fork server started in {server_start:.1f} s (once per process and kind of child)", flush=True)

    rows = []
    for count in counts:
        for name, way in (("fork server", forked_children), ("fresh interpreter", fresh_interpreters)):
            runs = [way(count, args.device) for _ in range(args.repeat)]
            row = {"way": name, "at_once": count, "wall_s": statistics.median(w for w, _ in runs),
                   "cpu_s_each": statistics.median(c / count for _, c in runs), "runs": runs}
            rows.append(row)
            print(f"{name:18} x{count:<3} wall {row['wall_s']:6.2f} s   CPU {row['cpu_s_each']:5.2f} s each", flush=True)

    print(f"\n{'ready children':28} {'at once':>7} {'wall (median)':>14} {'CPU each':>9}")
    for row in rows:
        print(f"{row['way']:28} {row['at_once']:7d} {row['wall_s']:12.2f} s {row['cpu_s_each']:7.2f} s")
    for count in counts:
        fork, fresh = (next(r for r in rows if r["way"] == w and r["at_once"] == count)
                       for w in ("fork server", "fresh interpreter"))
        print(f"x{count}: fresh / fork server = {fresh['wall_s'] / fork['wall_s']:.1f}x wall, "
              f"{fresh['cpu_s_each'] / max(fork['cpu_s_each'], 1e-9):.1f}x CPU")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    args.json.write_text(json.dumps({"device": args.device, "device_name": device_name, "cpus": os.cpu_count(),
                                     "isolated": bubblewrap_problem() is None, "server_start_s": server_start,
                                     "rows": rows, "torch": torch.__version__}, indent=2))
    forkserver.close_zygotes()


if __name__ == "__main__":
    main()
