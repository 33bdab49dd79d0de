"""An honest control job alone, then beside each kind of bad candidate, on one shared pool.

A bad sample must cost only itself (issue 22): a candidate that hangs, sleeps, floods its output
or keeps the device busy is ended within a bound derived from its task (``EvalSettings``'
``step_floor_s`` + ``step_multiple`` x the reference's time for the same work), and a timing run
beside it waits at most the lease's grace before freezing it (evaluators/sharing.py). This
measures what that means for a job beside it, in one process on one pool at the default jobs per
device:

- the control (the bundled Triton solution of relu(x + y), a final evaluation: correctness, then
  timing) is run ``--runs`` times alone, then ``--runs`` times beside each bad candidate, which
  is submitted first and given a few seconds to be into its hang;
- per case: the control's median latency (submit to answer), its ratio to alone (the target:
  at most 1.2), its longest latency (beside a kernel that never ends, the first control run
  waits for that job's end: sharing.py), whether every control run was judged correct, the control's median runtime
  against alone (a timing disturbed by the neighbour shows here), and when and how the bad
  candidate itself was answered.

The bad candidates are C++-language snapshots whose Python never reaches a kernel (no build
needed), and on a GPU a Triton kernel that never ends:

    python benchmarks/bad_neighbours.py --json bad_neighbours_cpu.json
    python benchmarks/bad_neighbours.py --device cuda --json bad_neighbours_h100.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import torch

from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.pool import LocalPool

_PY = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, y):\n"
BAD = {
    "spins in forward": ("cpp", _PY + "        while True:\n            pass\n"),
    "sleeps in forward": ("cpp", _PY + "        import time\n        time.sleep(3600)\n"),
    "hangs at import": ("cpp", "import torch.nn as nn\nwhile True:\n    pass\n"),
    "floods its output": ("cpp", _PY + "        while True:\n            print('x' * 4096, flush=True)\n"),
}
#: The GPU tests' candidate whose Triton kernel never ends.
_DEVICE_SPIN = Path(__file__).parents[1] / "tests" / "gpu" / "solutions" / "device_spin.py"
GPU_BAD = {"spins on the device": ("triton", _DEVICE_SPIN.read_text())}


def snapshot(root: Path, name: str, model_new: str) -> Path:
    folder = root / name.replace(" ", "_")
    (folder / "kernels").mkdir(parents=True)
    (folder / "model_new.py").write_text(model_new)
    return folder


def job(folder: Path, language: str, device: str, task_code: str, settings: EvalSettings, mode: Mode) -> EvalJob:
    return EvalJob(job_id=uuid.uuid4().hex[:12], task_id="bench/relu_add", task_code=task_code, language=language,
                   device=device, mode=mode, snapshot_dir=folder, settings=settings)


def control_runs(pool: LocalPool, control: EvalJob, runs: int) -> list[tuple[float, EvalResult]]:
    out = []
    for _ in range(runs):
        began = time.monotonic()
        result = pool.submit(control.model_copy(update={"job_id": uuid.uuid4().hex[:12]})).result()
        out.append((time.monotonic() - began, result))
    return out


def summary(runs: list[tuple[float, EvalResult]]) -> dict:
    runtimes = [r.runtime_ms for _, r in runs if r.runtime_ms]
    return {"latency_s": round(statistics.median(s for s, _ in runs), 2), "max_latency_s": round(max(s for s, _ in runs), 2),
            "correct": sum(r.correct for _, r in runs), "runs": len(runs),
            "runtime_ms": round(statistics.median(runtimes), 4) if runtimes else None,
            "errors": [r.error or "; ".join(r.violations) for _, r in runs if not r.correct][:2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--runs", type=int, default=3, help="control runs per case")
    parser.add_argument("--only", default="", help="comma-separated bad kinds to run (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    gpu = args.device == "cuda"
    elements = 1 << 22 if gpu else 1 << 16
    task_code = (example_dir() / "task.py").read_text().replace("1 << 24", f"1 << {elements.bit_length() - 1}")
    # The default protocol on a GPU; on the CPU (Triton's interpreter) a shorter one without the compile baseline.
    settings = EvalSettings() if gpu else EvalSettings(timed_calls=10, warmup_calls=1, 
                                                       compile_baseline=False)
    kinds = {**BAD, **(GPU_BAD if gpu else {})}
    if args.only:
        kinds = {k: v for k, v in kinds.items() if k in args.only.split(",")}
    root = Path(tempfile.mkdtemp(prefix="bad-neighbours-"))
    solution = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
    control = job(snapshot(root, "control", solution), "triton", args.device, task_code, settings, Mode.FINAL)
    rows: dict[str, dict] = {}
    with LocalPool() as pool:
        slots = pool.jobs_per_gpu if gpu else pool.jobs_per_cpu
        print(f"{args.device}: {torch.cuda.get_device_name(0) if gpu else platform.processor() or 'cpu'}, "
              f"{slots} jobs at once, control relu_add {elements} elements, {args.runs} runs per case", flush=True)
        control_runs(pool, control, 1)  # the baselines into the cache, the children's server started
        rows["alone"] = summary(control_runs(pool, control, args.runs))
        print(f"  alone: {rows['alone']}", flush=True)
        for kind, (language, code) in kinds.items():
            submitted = time.monotonic()
            bad = pool.submit(job(snapshot(root, kind, code), language, args.device, task_code, settings, Mode.VERIFY))
            time.sleep(3.0)
            row = summary(control_runs(pool, control, args.runs))
            row["neighbour_still_running"] = not bad.done()
            ended = bad.result()
            row["neighbour_answered_after_s"] = round(time.monotonic() - submitted, 1)
            row["neighbour"] = {"fault": ended.fault, "reward": ended.reward, "error": (ended.error or "")[:160]}
            rows[kind] = row
            print(f"  {kind}: {row}", flush=True)
        stragglers = sum(lease.stragglers for lease in pool.leases.values())
    alone = rows["alone"]
    print(f"\n{'beside':<22} {'latency s':>9} {'ratio':>6} {'max s':>6} {'correct':>8} {'runtime ms':>11} {'vs alone':>8} "
          f"{'bad ended at':>13}")
    for kind, row in rows.items():
        ratio = row["latency_s"] / alone["latency_s"]
        drift = (row["runtime_ms"] / alone["runtime_ms"] - 1) * 100 if row["runtime_ms"] and alone["runtime_ms"] else float("nan")
        row["ratio"], row["runtime_vs_alone_pct"] = round(ratio, 2), round(drift, 1)
        ended = f"{row['neighbour_answered_after_s']:.0f} s" if "neighbour" in row else "-"
        print(f"{kind:<22} {row['latency_s']:>9.2f} {ratio:>6.2f} {row['max_latency_s']:>6.1f} {row['correct']:>4}/{row['runs']:<3} "
              f"{row['runtime_ms'] or float('nan'):>11.4f} {drift:>+7.1f}% {ended:>13}")
    print(f"timing runs that froze a step still running after the grace: {stragglers}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "elements": elements, "runs": args.runs,
                                         "settings": settings.model_dump(), "cases": rows,
                                         "stragglers_frozen": stragglers}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
