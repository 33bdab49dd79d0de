"""Workspace build times: cold, nothing changed, one kernel edited, one binding edited; with the
precompiled torch headers (kernel_env.headers) and without, in the same run.

For each language (cpp, and cuda where nvcc is found) and each mode, a fresh workspace holding
the bundled relu(x + y) solution is built with `bash utils/compile.sh` as an agent would, then
edited and rebuilt; every step is timed end to end (the toolchain probe, ninja, the link and the
load check included). The headers are precompiled first, outside the timings. The issue's targets
(on the H100 machine): a cold build <= 15 s, a rebuild after editing one kernels/*.cu <= 3 s.

    python benchmarks/build_times.py [--languages cpp,cuda] [--repeat 3] [--json build_times.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernel_env import headers
from kernel_env.resources import example_dir
from kernel_env.tasks import resolve_task
from kernel_env.workspace import Workspace

STEPS = ("cold", "nothing changed", "edit kernel", "edit binding")
KERNEL = {"cpp": "kernels/relu_add.cpp", "cuda": "kernels/relu_add.cu"}
BINDING = "kernels/relu_add_binding.cpp"


def build(ws: Workspace, env: dict[str, str]) -> float:
    started = time.monotonic()
    proc = subprocess.run(["bash", "utils/compile.sh"], cwd=ws.path, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    if proc.returncode != 0 or "BUILD OK" not in proc.stdout:
        sys.exit(f"build failed in {ws.path}:\n{proc.stdout}{proc.stderr}")
    return seconds


def edit(path: Path) -> None:
    """A real change (a comment line), with the mtime moved on so ninja sees it at once."""
    path.write_text(path.read_text() + f"\n// edited {time.time_ns()}\n")
    later = time.time() + 2
    os.utime(path, (later, later))


def one_run(language: str, with_headers: bool, root: Path) -> dict[str, float]:
    ws = Workspace.create(resolve_task("example/relu_add"), language, root=root)
    ws.copy_solution(example_dir("relu_add") / "solutions" / language)
    env = {k: v for k, v in os.environ.items() if k not in ("KE_HEADERS", "HOME")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    if with_headers:
        env["KE_HEADERS"] = str(headers.headers_dir())
    try:
        times = {"cold": build(ws, env), "nothing changed": build(ws, env)}
        edit(ws.path / KERNEL[language])
        times["edit kernel"] = build(ws, env)
        edit(ws.path / BINDING)
        times["edit binding"] = build(ws, env)
        return times
    finally:
        ws.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cpp,cuda" if shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists() else "cpp"
    parser.add_argument("--languages", default=default)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("build_times.json"))
    args = parser.parse_args()
    languages = args.languages.split(",")
    for language in languages:
        proc = headers.precompile(language)
        print(f"{language}: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()}", flush=True)
        if proc.returncode != 0:
            return 1
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="build-times-") as root:
        for language in languages:
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for repeat in range(args.repeat):
                for with_headers in (False, True):  # interleaved, so both meet the same machine
                    times = one_run(language, with_headers, Path(root))
                    runs[with_headers].append(times)
                    print(f"{language}, {'with' if with_headers else 'without'} headers, run {repeat}: "
                          + ", ".join(f"{step} {times[step]:.1f}s" for step in STEPS), flush=True)
            for with_headers, found in runs.items():
                rows[f"{language}, {'precompiled headers' if with_headers else 'plain'}"] = {
                    step: {"median_s": statistics.median(t[step] for t in found), "runs_s": [t[step] for t in found]}
                    for step in STEPS}
    print(f"\n{'':30}" + "".join(f"{step:>17}" for step in STEPS))
    for name, row in rows.items():
        print(f"{name:30}" + "".join(f"{row[step]['median_s']:16.1f}s" for step in STEPS))
    args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
