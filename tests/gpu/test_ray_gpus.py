"""The Ray pool on a machine with two or more GPUs: one job per GPU, two jobs at once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.records import EvalJob, EvalSettings, Mode
from kernel_env.resources import example_dir

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kernel_env[ray]')")
from kernel_env.runtime.pool import RayPool  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

TASK_CODE = (example_dir() / "task.py").read_text().replace("N = 1 << 24", "N = 1 << 26")
SOLUTION = (Path(__file__).parent / "solutions" / "turn4_fused.py").read_text()


def _job(tmp_path: Path) -> EvalJob:
    snapshot = tmp_path / uuid.uuid4().hex[:8]
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text(SOLUTION)
    settings = EvalSettings(compile_baseline=False, timed_calls=200)  # long enough to overlap visibly
    return EvalJob(job_id=uuid.uuid4().hex[:12], task_id="example/relu_add_64M", task_code=TASK_CODE,
                   language="triton", device="cuda", mode=Mode.PROFILE, snapshot_dir=snapshot, settings=settings)


def test_two_jobs_run_at_once_each_on_its_own_gpu(tmp_path):
    ray.init(num_gpus=2, num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        pool = RayPool()
        assert pool.gpus == 2 and pool.max_in_flight == 2
        pool.submit(_job(tmp_path)).result(timeout=600)  # Triton's and the workers' first start out of the way
        started = time.monotonic()
        futures = [pool.submit(_job(tmp_path)) for _ in range(2)]
        results = [future.result(timeout=600) for future in futures]
        wall = time.monotonic() - started
        pool.close()
    finally:
        ray.shutdown()
    for result in results:
        assert result.correct and result.reward >= 2, (result.error, result.violations)
    devices = {result.ran_on.rsplit("/", 1)[1] for result in results}
    assert devices == {"cuda:0", "cuda:1"}, [result.ran_on for result in results]
    # Run one after the other, the two would take the sum of their durations.
    assert wall < 0.75 * sum(result.duration_s for result in results), (wall, [r.duration_s for r in results])
