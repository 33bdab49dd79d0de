"""The Ray pool on a local Ray instance (CPU jobs): same results as the local pool, its actor's
slots, and a job whose actor dies twice answered with an error instead of a hang."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support import ray_busy_worker, ray_workers_started, snapshot_job

pytestmark = pytest.mark.slow  # a local Ray instance, evaluation jobs on it

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kernel_env[ray]')")

from kernel_env.evaluators.records import EvalJob, EvalSettings, Mode  # noqa: E402
from kernel_env.resources import example_dir  # noqa: E402
from kernel_env.runtime.pool import LocalPool, RayPool, make_pool  # noqa: E402

TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12")
SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
ENDLESS = SOLUTION.replace("        x, y = x.contiguous(), y.contiguous()", "        while True:\n            pass")
SETTINGS = EvalSettings(step_timeout_s=300)


@pytest.fixture(scope="module")
def ray_pool():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pool = make_pool("ray")
    yield pool
    pool.close()
    ray.shutdown()


def job(tmp_path: Path, code: str, mode: Mode = Mode.VERIFY) -> EvalJob:
    return snapshot_job(tmp_path, code, task_id="test/relu_add_4k", task_code=TASK_CODE, language="triton",
                        device="cpu", mode=mode, settings=SETTINGS)


def test_a_ray_job_gives_the_same_result_as_the_local_pool(ray_pool, tmp_path):
    assert isinstance(ray_pool, RayPool)
    # One actor for the node's CPU (no GPU in the cluster), running two jobs at once, as a local pool does.
    [worker] = ray_workers_started(ray_pool, 1)
    assert (worker["device"], worker["slots"], ray_pool.slots) == ("cpu", 2, 2), worker
    assert set(worker) == {"name", "ready", "slots", "running", "host", "node", "device", "pid"}
    the_job = job(tmp_path, SOLUTION)
    remote = ray_pool.submit(the_job).result(timeout=300)
    with LocalPool(["cpu"]) as local_pool:
        local = local_pool.submit(the_job).result(timeout=300)
    assert remote.correct and local.correct, (remote.error, local.error)
    assert type(remote) is type(local) and remote.summary().keys() == local.summary().keys()
    assert [t.correct for t in remote.trials] == [t.correct for t in local.trials]
    assert (remote.job_id, remote.mode, remote.reward) == (local.job_id, local.mode, local.reward)


def test_cuda_jobs_on_a_cluster_without_gpus_are_answered_with_an_error(ray_pool, tmp_path):
    cuda_job = job(tmp_path, SOLUTION).model_copy(update={"device": "cuda"})
    result = ray_pool.submit(cuda_job).result(timeout=10)
    assert not result.correct and "no GPU" in result.error and result.reward is None and result.fault == "evaluator"


def _kill_a_busy_worker(pool: RayPool, avoid: frozenset[int] = frozenset()) -> int:
    pid = ray_busy_worker(pool, avoid)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_job_whose_worker_dies_is_retried_once_then_answered_with_an_error(ray_pool, tmp_path):
    future = ray_pool.submit(job(tmp_path, ENDLESS))
    first = _kill_a_busy_worker(ray_pool)
    _kill_a_busy_worker(ray_pool, avoid=frozenset({first}))   # the retry, on the actor started in its place
    result = future.result(timeout=120)
    assert not result.correct and result.reward is None and result.fault == "evaluator"
    assert "died twice" in result.error, result.error
    # The pool still works after losing two actors: a third has taken the node's CPU.
    assert ray_pool.submit(job(tmp_path, SOLUTION)).result(timeout=300).correct
    assert len(ray_workers_started(ray_pool, 1)) == 1
