"""Where a CUDA workspace's edit -> build time goes: nvcc's phases, and the same compile with flags changed.

After an edit of the kernel (benchmarks/edit_verify.py's "edit kernel"), the build is one nvcc
compile of the .cu and one link. This builds the bundled relu(x + y) CUDA solution in a workspace as
`bash utils/compile.sh` does (outside the sandbox), edits the kernel a few times, then runs the
build's own nvcc command (ninja -t commands) as built and with one change at a time, the link
alone, and nvcc --time's per-phase split. Each best of --repeat. Prints a table, writes JSON.

    python benchmarks/nvcc_phases.py [--repeat 3] [--json nvcc_phases.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from build_times import build, edit  # benchmarks/build_times.py: run as a script, this folder is on sys.path

from kernel_env import headers
from kernel_env.resources import example_dir
from kernel_env.tasks import resolve_task
from kernel_env.workspace import Workspace

KERNEL = "kernels/relu_add.cu"


def best(command: str, cwd: Path, repeat: int) -> float | None:
    """The shortest wall time of ``repeat`` runs of ``command`` (None where it fails)."""
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        proc = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"failed: {command[:200]}\n{proc.stderr[-800:]}", file=sys.stderr)
            return None
        times.append(time.monotonic() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("nvcc_phases.json"))
    args = parser.parse_args()
    headers.precompile("cuda")
    ws = Workspace.create(resolve_task("example/relu_add"), "cuda", root=Path(tempfile.mkdtemp()))
    ws.copy_solution(example_dir("relu_add") / "solutions" / "cuda")
    env = {k: v for k, v in os.environ.items() if k not in ("KE_HEADERS", "HOME")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    rows = {"cold build": build(ws, env)}
    edits = []
    for _ in range(args.repeat):
        edit(ws.path / KERNEL)
        edits.append(build(ws, env))
    rows["edit kernel: build (compile.sh)"] = min(edits)
    commands = subprocess.run(["ninja", "-C", "build", "-t", "commands"], cwd=ws.path, capture_output=True, text=True,
                              check=True).stdout.splitlines()
    compile_cu = next(c for c in commands if KERNEL in c and "nvcc" in c)
    link = commands[-1]
    variants = {
        "nvcc, as built": compile_cu,
        "nvcc, no -lineinfo": compile_cu.replace(" -lineinfo", ""),
        "nvcc, no depfile": re.sub(r"--generate-dependencies-with-compile --dependency-output \S+ ", "", compile_cu),
        "nvcc, host -O0": compile_cu.replace("-Xcompiler -fPIC", "-Xcompiler -fPIC -Xcompiler -O0"),
        "nvcc, no torch include dirs": re.sub(r"-isystem \S+torch/include\S* ", "", compile_cu),
        "link": link,
    }
    for name, command in variants.items():
        rows[name] = best(command, ws.path, args.repeat)
    phases_csv = ws.path / "build" / "nvcc_time.csv"
    subprocess.run(f"{compile_cu} --time {phases_csv}", shell=True, cwd=ws.path, capture_output=True)
    phases = {}
    if phases_csv.exists():
        for row in csv.reader(phases_csv.read_text().splitlines()[1:]):
            if len(row) >= 8:
                phases[row[1].strip()] = phases.get(row[1].strip(), 0.0) + float(row[6]) / 1e3
    print(f"{'what':<40} {'seconds':>8}")
    for name, seconds in rows.items():
        print(f"{name:<40} {'-' if seconds is None else f'{seconds:8.3f}'}")
    print("nvcc --time, one compile:")
    for name, seconds in phases.items():
        print(f"  {name:<38} {seconds:8.3f}")
    args.json.write_text(json.dumps({"rows": rows, "nvcc_phases_s": phases, "command": compile_cu}, indent=1))
    print(f"wrote {args.json}")
    ws.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
