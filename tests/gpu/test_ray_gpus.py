"""The Ray pool on a machine with two or more GPUs (a local Ray cluster given two of them): one actor
per GPU, each sharing its GPU among several jobs; two jobs at once, each on its own GPU; an actor
killed mid-job has its job run again and answered while the job on the other GPU goes on, and its
GPU is taken up again by an actor started in its place."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from support import ray_busy_worker, ray_workers_started, snapshot_job

from kernel_env.config import jobs_per_gpu
from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.pool import RayPool

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kernel_env[ray]')")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

TASK_CODE = (example_dir() / "task.py").read_text().replace("N = 1 << 24", "N = 1 << 26")
SOLUTION = (Path(__file__).parent / "solutions" / "turn4_fused.py").read_text()


@pytest.fixture(scope="module")
def ray_pool():
    ray.init(num_gpus=2, num_cpus=8, include_dashboard=False, log_to_driver=False)
    pool = RayPool(refresh_s=2.0)
    yield pool
    pool.close()
    ray.shutdown()


def _job(tmp_path: Path) -> EvalJob:
    settings = EvalSettings(compile_baseline=False, timed_calls=200)  # long enough to overlap visibly
    return snapshot_job(tmp_path, SOLUTION, task_id="example/relu_add_64M", task_code=TASK_CODE, language="triton",
                        device="cuda", mode=Mode.PROFILE, settings=settings)


def _gpu(result: EvalResult) -> str:
    """The GPU the job ran on, by the host's numbering (``EvalResult.ran_on`` is ``host/cuda:N``)."""
    return result.ran_on.rsplit("/", 1)[1]


def test_two_jobs_run_at_once_each_on_its_own_gpu(ray_pool, tmp_path):
    workers = ray_workers_started(ray_pool, 2)
    assert ray_pool.gpus == 2 and sorted(w["device"] for w in workers) == ["cuda:0", "cuda:1"], workers
    assert ray_pool.slots == 2 * jobs_per_gpu()
    # Out of the way first: Triton's first compile, and each worker's first job (its fork server's start).
    for warm_up in [ray_pool.submit(_job(tmp_path)) for _ in range(2)]:
        warm_up.result(timeout=600)
    started = time.monotonic()
    futures = [ray_pool.submit(_job(tmp_path)) for _ in range(2)]
    results = [future.result(timeout=600) for future in futures]
    wall = time.monotonic() - started
    for result in results:
        assert result.correct and result.reward >= 2, (result.error, result.violations)
    assert {_gpu(result) for result in results} == {"cuda:0", "cuda:1"}, [result.ran_on for result in results]
    # Run one after the other, the two would take the sum of their durations.
    assert wall < 0.75 * sum(result.duration_s for result in results), (wall, [r.duration_s for r in results])


def test_a_worker_killed_mid_job_has_its_job_retried_and_the_other_gpu_goes_on(ray_pool, tmp_path):
    killed = ray_pool.submit(_job(tmp_path))
    victim = ray_busy_worker(ray_pool)  # the only job on the cluster: its actor holds one GPU
    other = ray_pool.submit(_job(tmp_path))
    bystander = ray_busy_worker(ray_pool, avoid=frozenset({victim}))  # the other job, sent to the other GPU's actor
    time.sleep(1.0)  # into the job: its snapshot unpacked, its processes starting
    assert not killed.done()
    os.kill(victim, signal.SIGKILL)
    retried, unaffected = killed.result(timeout=300), other.result(timeout=300)
    for result in (retried, unaffected):
        assert result.correct and result.reward >= 2 and result.fault is None, (result.error, result.violations)
    os.kill(bystander, 0)  # the other GPU's actor is alive: only the victim was lost
    # An actor is started in the victim's place, on the GPU it freed, and the pool uses both GPUs again.
    deadline = time.monotonic() + 120
    while {w["pid"] for w in ray_workers_started(ray_pool, 2)} & {victim} and time.monotonic() < deadline:
        time.sleep(0.5)
    workers = ray_workers_started(ray_pool, 2)
    assert victim not in {w["pid"] for w in workers} and sorted(w["device"] for w in workers) == ["cuda:0", "cuda:1"]
    results = [future.result(timeout=300) for future in [ray_pool.submit(_job(tmp_path)) for _ in range(2)]]
    assert all(result.correct for result in results) and {_gpu(result) for result in results} == {"cuda:0", "cuda:1"}
