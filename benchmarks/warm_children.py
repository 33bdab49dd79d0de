"""Verify round trip with and without warm children (children.Spares), in the same run.

Runs N verification jobs of the bundled relu(x + y) task with its Triton solution (on the GPU
when there is one, else under Triton's interpreter on the CPU), first with every child started
for its job (KERNEL_ENV_WARM_CHILDREN=0), then with children started ahead of their jobs (=1).
Between jobs it waits --gap seconds, as a pool does when episodes spend time between
verifications; the spares import in that time. Reports each mode's median and spread of job
wall time (EvalResult.duration_s), the ratio, and writes JSON.

    python benchmarks/warm_children.py --jobs 10 --gap 5 --json warm_children.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import torch

from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, Mode
from kernel_env.resources import example_dir


def run(mode: str, jobs: int, gap: float, snapshot: Path, task_code: str, device: str) -> list[float]:
    os.environ["KERNEL_ENV_WARM_CHILDREN"] = mode
    durations = []
    for index in range(jobs + 1):  # the first job of each mode warms caches (and starts the first spares)
        job = EvalJob(job_id=uuid.uuid4().hex[:12], task_id="bench/relu_add", task_code=task_code, language="triton",
                      device=device, mode=Mode.VERIFY, snapshot_dir=snapshot)
        result = evaluate(job)
        if not result.correct:
            raise SystemExit(f"{mode=}: job {index} was not correct: {result.error or result.violations}")
        if index:
            durations.append(result.duration_s)
            print(f"warm={mode} job {index}: {result.duration_s:.2f} s", flush=True)
        time.sleep(gap)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--gap", type=float, default=5.0, help="seconds between jobs")
    parser.add_argument("--json", type=Path, default=Path("warm_children.json"))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = "1 << 24" if device == "cuda" else "1 << 12"
    task_code = (example_dir() / "task.py").read_text().replace("1 << 24", size)
    snapshot = Path(tempfile.mkdtemp()) / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text((example_dir() / "solutions" / "triton" / "model_new.py").read_text())
    rows = {}
    for mode, label in (("0", "cold (started per job)"), ("1", "warm (spares)")):
        durations = run(mode, args.jobs, args.gap, snapshot, task_code, device)
        rows[label] = {"median_s": statistics.median(durations), "min_s": min(durations), "max_s": max(durations),
                       "jobs_s": durations}
    cold, warm = (row["median_s"] for row in rows.values())
    print(f"\n{'verify job wall time':26} {'median s':>9} {'min':>7} {'max':>7}")
    for label, row in rows.items():
        print(f"{label:26} {row['median_s']:9.2f} {row['min_s']:7.2f} {row['max_s']:7.2f}")
    print(f"cold / warm: {cold / warm:.2f}x on {device} ({torch.cuda.get_device_name() if device == 'cuda' else platform.processor() or 'cpu'})")
    args.json.write_text(json.dumps({"device": device, "gap_s": args.gap, "rows": rows, "cold_over_warm": cold / warm,
                                     "torch": torch.__version__, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
