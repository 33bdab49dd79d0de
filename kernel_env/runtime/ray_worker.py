"""The Ray task behind RayPool: unpack a job's snapshot on the worker and run the trusted harness.

Runs on a Ray worker, which Ray gives ``num_gpus=1`` (it sets CUDA_VISIBLE_DEVICES to the GPU
it assigned). The harness starts its isolated children with an environment of its own, so it
is told the physical GPU id, not the worker's renumbered ``cuda:0``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import ray

from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalResult


@ray.remote
def evaluate_remote(job: EvalJob, snapshot: dict[str, bytes]) -> EvalResult:
    directory = Path(tempfile.mkdtemp(prefix=f"ray-snapshot-{job.job_id}-"))
    try:
        for relative, data in snapshot.items():
            path = directory / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        gpus = ray.get_gpu_ids()
        device = f"cuda:{int(gpus[0])}" if job.device == "cuda" and gpus else "cpu"
        return evaluate(job.model_copy(update={"snapshot_dir": directory}), device=device)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
