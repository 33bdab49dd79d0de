"""Throughput of queued CPU evaluation jobs: the local pool vs the Ray pool on this machine.

Submits the same N verification jobs (a tiny relu(x + y) task, the bundled Triton solution run
by Triton's interpreter) to each pool at once and measures how long the queue takes to drain.
Both run ``jobs_per_cpu`` jobs at once (each timing run alone): the local pool in this process,
the Ray pool in its actor for this node's CPU, so the difference is what Ray adds (sending the
snapshot, the actor's round trip). Prints a table and writes JSON.

    python benchmarks/pool_throughput.py --jobs 200 --json pool_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

from kernel_env.evaluators.records import EvalJob, Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.pool import GpuPool, LocalPool, RayPool

TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12")
SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()


def make_jobs(root: Path, count: int) -> list[EvalJob]:
    snapshot = root / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text(SOLUTION)
    return [EvalJob(job_id=uuid.uuid4().hex[:12], task_id="bench/relu_add_4k", task_code=TASK_CODE, language="triton",
                    device="cpu", mode=Mode.VERIFY, snapshot_dir=snapshot) for _ in range(count)]


def drain(pool: GpuPool, jobs: list[EvalJob]) -> dict:
    started = time.perf_counter()
    futures = [pool.submit(job) for job in jobs]
    results = [future.result() for future in futures]
    elapsed = time.perf_counter() - started
    return {"jobs": len(jobs), "seconds": round(elapsed, 2), "jobs_per_minute": round(60 * len(jobs) / elapsed, 2),
            "correct": sum(r.correct for r in results), "errors": sorted({r.error for r in results if r.error})[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray instance")
    parser.add_argument("--json", type=Path, default=Path("pool_throughput.json"))
    args = parser.parse_args()

    import ray

    with tempfile.TemporaryDirectory() as root:
        jobs = make_jobs(Path(root), args.jobs)
        with LocalPool(["cpu"]) as pool:
            drain(pool, jobs[:1])  # warm the baseline cache and the file cache for both
            local = drain(pool, jobs)
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
        try:
            with RayPool() as pool:
                drain(pool, jobs[:pool.slots])  # the actor's fork server
                remote = drain(pool, jobs)
                remote["slots"] = pool.slots
        finally:
            ray.shutdown()

    ratio = round(local["seconds"] / remote["seconds"], 2)
    print(f"{'pool':<8}{'jobs':>6}{'seconds':>10}{'jobs/min':>10}{'correct':>9}")
    for name, row in (("local", local), (f"ray x{remote['slots']}", remote)):
        print(f"{name:<8}{row['jobs']:>6}{row['seconds']:>10}{row['jobs_per_minute']:>10}{row['correct']:>9}")
    print(f"ray / local throughput: {ratio}x")
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "local": local, "ray": remote, "ray_over_local": ratio}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
