"""Edit -> verified latency: kernel_env's loop against `load_inline` + a KernelBench-style eval.

The same kernel (the bundled relu(x + y) solution, cpp or cuda) goes through two loops, each
timed from "the source is written" to "the numbers are back", first cold and then after an
edit of the kernel file (a comment line: the compilers still redo their work):

- ours: the sources land in an episode's workspace, `bash utils/compile.sh` builds them in the
  sandbox (ninja: only what changed; the torch headers precompiled), then the broker evaluates the workspace in the pool:
  `verify` (the 5 correctness trials) and `profile` (correctness, then the timed calls, eager
  from the baseline cache as in an RL run); then `--round-trips` more verifies of the same build
  as the agent asks for them (`python3 -m utils.verification` in the sandbox, through the
  broker's socket), each split into the job's own steps (`EvalResult.steps_s`) and what lies
  outside the job (client, socket, snapshot, queue);
- load_inline: a fresh Python process (as KernelBench's evaluation runs each sample), which
  builds the same sources with `torch.utils.cpp_extension.load_inline` into its build folder
  (kept between the cold run and the edit, as its cache allows), then runs 5 correctness
  trials against `Model` and times 100 calls (KernelBench's defaults).

Prints a table and writes JSON.

    python benchmarks/edit_verify.py [--language cpp|cuda] [--repeat 3] [--json edit_verify.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from build_times import (
    edit,  # benchmarks/build_times.py: run as a script, this folder is on sys.path
)

from kernel_env import headers
from kernel_env.evaluators.harness import measure_baselines
from kernel_env.evaluators.records import Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import Episode, default_device
from kernel_env.tasks import resolve_task

SOLUTIONS = example_dir("relu_add") / "solutions"
KERNEL = {"cpp": "relu_add.cpp", "cuda": "relu_add.cu"}
BINDING = "relu_add_binding.cpp"

# One process per evaluation, as KernelBench runs them: build with load_inline, check, time.
KERNELBENCH_STYLE = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.cpp_extension import load_inline
    language, device, build_dir, task_file = sys.argv[1:5]
    sources = {name: open(f"{build_dir}/../{name}").read() for name in ("kernel", "binding")}
    flags = ["-O3"] + (["-fopenmp"] if language == "cpp" else [])
    module = load_inline("relu_add_inline", cpp_sources=[sources["binding"]] if language == "cuda" else
                         [sources["kernel"], sources["binding"]], cuda_sources=[sources["kernel"]] if language == "cuda"
                         else None, extra_cflags=flags, extra_ldflags=["-fopenmp"] if language == "cpp" else [],
                         extra_cuda_cflags=["-O3"], build_directory=build_dir, verbose=False)
    scope = {}
    exec(open(task_file).read(), scope)
    model = scope["Model"]().to(device)
    for trial in range(5):
        torch.manual_seed(trial)
        inputs = [t.to(device) for t in scope["get_inputs"]()]
        torch.testing.assert_close(module.relu_add(*inputs), model(*inputs), atol=1e-2, rtol=1e-2)
    inputs = [t.to(device) for t in scope["get_inputs"]()]
    times = []
    for _ in range(100):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); module.relu_add(*inputs); end.record(); torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter(); module.relu_add(*inputs); times.append((time.perf_counter() - began) * 1e3)
    print(sorted(times)[len(times) // 2])
""")


def inline_binding(text: str) -> str:
    """The workspace binding as load_inline takes it: its own PYBIND11_MODULE instead of the registry."""
    lines = [line for line in text.splitlines() if "binding_registry.h" not in line and not line.startswith("REGISTER_BINDING")]
    return "\n".join(lines) + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { register_relu_add(m); }\n"


VERIFY_COMMAND = "python3 -m utils.verification"


def ours(language: str, device: str, root: Path, *, round_trips: int = 0, trips: list[dict] | None = None) -> dict[str, float]:
    """The loop's times; each warm verify round trip (its wall time, the job's, the job's steps) goes to ``trips``."""
    task = resolve_task("example/relu_add")
    times: dict[str, float] = {}
    measure_baselines(task.id, task.code, device=device)  # an RL run's baselines come from the cache: not timed
    with Episode.open(task, language=language, device=device, root=root) as episode:
        for step in ("cold", "edit kernel"):
            started = time.monotonic()
            if step == "cold":
                episode.workspace.copy_solution(SOLUTIONS / language)
            else:
                edit(episode.workspace.path / "kernels" / KERNEL[language])
            build = episode.compile()
            assert build.ok, build.output
            built = time.monotonic()
            verified = episode.evaluate(Mode.VERIFY)
            assert verified.correct, verified.summary()
            checked = time.monotonic()
            profiled = episode.evaluate(Mode.PROFILE)
            assert profiled.correct, profiled.summary()
            times[f"{step}: build"] = built - started
            times[f"{step}: verified"] = checked - started
            times[f"{step}: profiled"] = built - started + (time.monotonic() - checked)
        for _ in range(round_trips):
            started = time.monotonic()
            answer = episode.sandbox.exec(VERIFY_COMMAND, timeout=600)
            wall = time.monotonic() - started
            result = episode.results[-1]
            assert answer.ok and result.correct and result.mode == Mode.VERIFY, answer.output
            trips.append({"round_trip_s": wall, "job_s": result.duration_s, "steps_s": dict(result.steps_s)})
    return times


def load_inline_loop(language: str, device: str, root: Path) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(dir=root))
    build_dir = folder / "build"
    build_dir.mkdir()
    (folder / "kernel").write_text((SOLUTIONS / language / "kernels" / KERNEL[language]).read_text())
    (folder / "binding").write_text(inline_binding((SOLUTIONS / language / "kernels" / BINDING).read_text()))
    task_file = folder / "task.py"
    task_file.write_text(resolve_task("example/relu_add").code)
    times = {}
    for step in ("cold", "edit kernel"):
        if step == "edit kernel":
            edit(folder / "kernel")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", KERNELBENCH_STYLE, language, device, str(build_dir), str(task_file)],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"load_inline run failed:\n{proc.stdout}{proc.stderr}")
        times[f"{step}: profiled"] = time.monotonic() - started
    return times


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def print_round_trips(trips: list[dict]) -> None:
    """The warm verify round trip, and where it went: the job's steps (median of each) and the rest."""
    steps = sorted({name for trip in trips for name in trip["steps_s"]})
    print(f"\nwarm verify round trip ({VERIFY_COMMAND} in the sandbox), median of {len(trips)}")
    print(f"{'round trip':40}{median([t['round_trip_s'] for t in trips]):8.3f}s")
    print(f"{'  outside the job (client, broker, queue)':40}{median([t['round_trip_s'] - t['job_s'] for t in trips]):8.3f}s")
    print(f"{'  the job':40}{median([t['job_s'] for t in trips]):8.3f}s")
    for name in sorted(steps, key=lambda n: -median([t["steps_s"].get(n, 0.0) for t in trips])):
        print(f"{'    ' + name:40}{median([t['steps_s'].get(name, 0.0) for t in trips]):8.3f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--language", choices=("cpp", "cuda"), default=None, help="default: cuda on a GPU, else cpp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=5, help="warm verify round trips after each run of ours")
    parser.add_argument("--json", type=Path, default=Path("edit_verify.json"))
    args = parser.parse_args()
    device = default_device()
    language = args.language or ("cuda" if device == "cuda" else "cpp")
    precompiled = headers.precompile(language)  # the steady state of a machine (docs/design.md, Builds): not timed
    print(f"{language}: {precompiled.stdout.strip().splitlines()[-1] if precompiled.stdout.strip() else precompiled.stderr}")
    runs: dict[str, list[dict[str, float]]] = {"kernel_env": [], "load_inline": []}
    trips: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="edit-verify-") as root:
        for repeat in range(args.repeat):
            for name, loop in (("kernel_env", functools.partial(ours, round_trips=args.round_trips, trips=trips)),
                               ("load_inline", load_inline_loop)):
                times = loop(language, device, Path(root))
                runs[name].append(times)
                print(f"{name}, run {repeat}: " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()), flush=True)
    rows = {name: {key: statistics.median(t[key] for t in found) for key in found[0]} for name, found in runs.items()}
    print(f"\n{language} on {device}, median of {args.repeat} (seconds from the source written to the numbers back)")
    print(f"{'':12}{'cold: verified':>16}{'cold: profiled':>16}{'edit: verified':>16}{'edit: profiled':>16}")
    for name, row in rows.items():
        cells = [row.get(f"{step}: {what}") for step in ("cold", "edit kernel") for what in ("verified", "profiled")]
        print(f"{name:12}" + "".join(f"{c:15.1f}s" if c is not None else f"{'—':>16}" for c in cells))
    if trips:
        print_round_trips(trips)
    args.json.write_text(json.dumps({"language": language, "device": device, "runs": runs, "median_s": rows,
                                     "verify_round_trips": trips}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
