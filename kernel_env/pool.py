"""GPU evaluation pools: where trusted evaluation jobs run.

``GpuPool.submit(job) -> Future[EvalResult]``. The ``local`` pool has one worker thread per
visible GPU (or one CPU worker when there is none); a worker runs one job at a time, so
timings never share a device, and every job runs its code in fresh isolated child
processes (``kernel_env.evaluators.harness``): a CUDA fault, a hang or ``os._exit`` ends that
job alone. Jobs wait in a priority queue (final evaluations first, then FIFO). Every job is
answered with an EvalResult, never with an exception.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Protocol

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalResult

log = logging.getLogger(__name__)


class GpuPool(Protocol):
    """Runs evaluation jobs on devices the agent cannot touch."""

    def submit(self, job: EvalJob) -> Future[EvalResult]:
        """Queue a job; the future always resolves to an EvalResult (errors are inside it)."""

    def close(self) -> None:
        """Finish running jobs, answer queued ones with an error, stop the workers."""


def visible_gpus() -> list[str]:
    try:
        import torch

        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except Exception:  # a broken CUDA install means no GPU for us, not a crash
        return []


class LocalPool:
    """One worker per device on this machine."""

    def __init__(self, devices: list[str] | None = None, *, baselines: BaselineCache | None = None,
                 reward_kind: str = "milestone"):
        self.devices = devices or visible_gpus() or ["cpu"]
        self.baselines = baselines or BaselineCache()
        self.reward_kind = reward_kind
        self._queue: list[tuple[int, int, EvalJob, Future]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._workers = [threading.Thread(target=self._work, args=(d,), name=f"kernel_env-pool-{d}", daemon=True) for d in self.devices]
        for worker in self._workers:
            worker.start()

    @property
    def has_gpu(self) -> bool:
        return any(d.startswith("cuda") for d in self.devices)

    def submit(self, job: EvalJob) -> Future[EvalResult]:
        future: Future[EvalResult] = Future()
        if job.device == "cuda" and not self.has_gpu:
            future.set_result(_error(job, "this pool has no GPU: the job asks for device cuda (use --device cpu for cpp or triton)"))
            return future
        with self._cv:
            if self._closed:
                future.set_result(_error(job, "the evaluation pool is closed"))
                return future
            heapq.heappush(self._queue, (job.priority, next(self._order), job, future))
            self._cv.notify()
        return future

    def _work(self, device: str) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed and not self._queue:
                    return
                _, _, job, future = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            wanted_cuda = job.device == "cuda"
            run_on = device if wanted_cuda == device.startswith("cuda") else "cpu"
            try:
                result = evaluate(job, device=run_on, baselines=self.baselines, reward_kind=self.reward_kind)
            except Exception as exc:  # a harness bug must still answer the job
                log.exception("evaluation of %s failed", job.job_id)
                result = _error(job, f"internal evaluation error: {type(exc).__name__}: {exc}")
            future.set_result(result)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cv.notify_all()
        for _, _, job, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_result(_error(job, "the evaluation pool was closed before this job ran"))
        for worker in self._workers:
            worker.join(timeout=1)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _error(job: EvalJob, message: str) -> EvalResult:
    return EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                      mode=job.mode, correct=False, error=message, reward=-1.0, snapshot_hash=job.snapshot_hash)


def make_pool(kind: str = "local", **options) -> GpuPool:
    if kind == "local":
        return LocalPool(**options)
    raise ValueError(f"unknown pool {kind!r}; available: local")


# The CPU pool is shared by default: a CPU job's timings are only honest when jobs do not overlap.
_default_lock = threading.Lock()
_default_pool: LocalPool | None = None


def default_pool() -> LocalPool:
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = LocalPool()
        return _default_pool


__all__ = ["GpuPool", "LocalPool", "default_pool", "make_pool", "visible_gpus"]
