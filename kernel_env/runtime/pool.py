"""GPU evaluation pools: where trusted evaluation jobs run.

``GpuPool.submit(job) -> Future[EvalResult]``. The ``local`` pool runs several jobs on each
visible GPU at once (on the CPU when there is none), but never a timing run beside
anything else on its device (evaluators/sharing.py), and every job runs its code in fresh
isolated child processes (``kernel_env.evaluators.harness``): a CUDA fault, a hang or
``os._exit`` ends that job alone. The ``ray`` pool runs the same jobs as Ray tasks on a cluster, one per GPU
(``num_gpus=1``). Jobs wait in a priority queue (final evaluations first, then FIFO). Every
job is answered with an EvalResult, never with an exception.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate, reserve_spares
from kernel_env.evaluators.records import EvalJob, EvalResult
from kernel_env.evaluators.sharing import DeviceLease

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


class _QueuedPool(ABC):
    """The job queue both pools share: priority order (final evaluations first, then FIFO), a
    closed pool answering instead of queueing, and ``close()`` answering what still waits."""

    _no_gpu_message = "this pool has no GPU: the job asks for device cuda"

    def __init__(self) -> None:
        self._queue: list[tuple[int, int, EvalJob, Future]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._threads: list[threading.Thread] = []

    @property
    @abstractmethod
    def has_gpu(self) -> bool:
        """Whether this pool can run cuda jobs."""

    def submit(self, job: EvalJob) -> Future[EvalResult]:
        future: Future[EvalResult] = Future()
        if job.device == "cuda" and not self.has_gpu:
            future.set_result(_error(job, self._no_gpu_message))
            return future
        with self._cv:
            if self._closed:
                future.set_result(_error(job, "the evaluation pool is closed"))
                return future
            heapq.heappush(self._queue, (job.priority, next(self._order), job, future))
            self._cv.notify_all()
        return future

    def close(self) -> None:
        """Answer queued jobs with an error and stop taking new ones; running jobs finish."""
        with self._cv:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cv.notify_all()
        for _, _, job, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_result(_error(job, "the evaluation pool was closed before this job ran"))
        for thread in self._threads:
            thread.join(timeout=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_jobs_per_gpu() -> int:
    """Jobs one GPU runs at once: ``KERNEL_ENV_JOBS_PER_GPU``, else 4."""
    return _jobs_setting("KERNEL_ENV_JOBS_PER_GPU", 4)


def default_jobs_per_cpu() -> int:
    """Jobs the CPU device runs at once: ``KERNEL_ENV_JOBS_PER_CPU``, else 2 (a job that hangs
    then takes one slot, while the other's timing runs freeze it)."""
    return _jobs_setting("KERNEL_ENV_JOBS_PER_CPU", 2)


def _jobs_setting(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return max(1, int(value))
    except ValueError:
        raise ValueError(f"{name}={value!r}: give a whole number of jobs (1 runs one job at a time)") from None


class LocalPool(_QueuedPool):
    """Workers for the devices of this machine.

    A GPU runs up to ``jobs_per_gpu`` jobs at once (``default_jobs_per_gpu()``), the CPU device
    ``jobs_per_cpu`` (``default_jobs_per_cpu()``): their untimed steps side by side and each
    timing run alone, under the device's ``DeviceLease`` (evaluators/sharing.py), the other jobs'
    processes frozen meanwhile. A job that runs out of device memory beside others is run again
    with the GPU to itself before it is answered (``_evaluate``)."""

    _no_gpu_message = "this pool has no GPU: the job asks for device cuda (use --device cpu for cpp or triton)"

    def __init__(self, devices: list[str] | None = None, *, baselines: BaselineCache | None = None,
                 jobs_per_gpu: int | None = None, jobs_per_cpu: int | None = None):
        super().__init__()
        self.devices = devices or visible_gpus() or ["cpu"]
        self.baselines = baselines or BaselineCache()
        self.jobs_per_gpu = jobs_per_gpu or default_jobs_per_gpu()
        self.jobs_per_cpu = jobs_per_cpu or default_jobs_per_cpu()
        slots = {d: self.jobs_per_gpu if d.startswith("cuda") else self.jobs_per_cpu for d in self.devices}
        #: The shared devices' leases, by device (``DeviceLease.account()``: how each one's time went).
        # The CPU's lease freezes a step mid-way at once (a frozen process leaves nothing running);
        # a GPU's lets a step run a second first (a kernel it already launched would run on).
        self.leases = leases = {d: DeviceLease(grace_s=1.0 if d.startswith("cuda") else 0.0)
                                for d in self.devices if slots[d] > 1}
        # Held as a sharer (untimed) by every job on a shared GPU for the whole job, alone (timing) by
        # a job run again after running out of device memory: only then is the memory free of the
        # other jobs' processes (a timing run does not free what a waiting process holds).
        self._occupancy = {d: DeviceLease() for d in leases if d.startswith("cuda")}
        if any(d.startswith("cuda") for d in leases):
            reserve_spares(self.jobs_per_gpu)
        for device in self.devices:
            for slot in range(slots[device]):
                self._threads.append(threading.Thread(target=self._work, args=(device, leases.get(device)),
                                                      name=f"kernel_env-pool-{device}-{slot}", daemon=True))
        for worker in self._threads:
            worker.start()

    @property
    def has_gpu(self) -> bool:
        return any(d.startswith("cuda") for d in self.devices)

    def _work(self, device: str, lease: DeviceLease | None) -> None:
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
                result = self._evaluate(job, run_on, device, lease, future)
            except Exception as exc:  # a harness bug must still answer the job
                log.exception("evaluation of %s failed", job.job_id)
                result = _error(job, f"internal evaluation error: {type(exc).__name__}: {exc}")
            if not future.done():
                future.set_result(result)

    def _evaluate(self, job: EvalJob, run_on: str, device: str, lease: DeviceLease | None, future: Future) -> EvalResult:
        """Evaluate the job, answering as soon as the result is complete (its processes end after
        that). On a shared GPU, a job that ran out of device memory is not answered but run again
        with the GPU to itself: the other jobs' memory may have been what it lacked, and an honest
        kernel must not be judged wrong for that. What the second run says is the answer."""
        options = {"device": run_on, "baselines": self.baselines}
        if lease is None:
            return evaluate(job, **options, answer=future.set_result)
        if run_on != device or device not in self._occupancy:  # on the CPU: no device memory to run short of
            return evaluate(job, **options, lease=lease, answer=future.set_result)
        occupancy = self._occupancy[device]

        def answer(result: EvalResult) -> None:
            if not _short_of_device_memory(result):
                future.set_result(result)

        with occupancy.untimed():
            result = evaluate(job, **options, lease=lease, answer=answer)
        if not _short_of_device_memory(result):
            return result
        log.info("job %s ran out of device memory beside other jobs; running it again with %s to itself", job.job_id, device)
        shared_run_s = result.duration_s or 0.0

        def answer_alone(result: EvalResult) -> None:
            result.steps_s[SHORT_OF_MEMORY_STEP] = shared_run_s
            future.set_result(result)

        with occupancy.timing(drain=True):  # every other job on the device has ended; none starts until this one has
            return evaluate(job, **options, answer=answer_alone)


class RayPool(_QueuedPool):
    """The same jobs as Ray tasks on a Ray cluster: one job per GPU (``num_gpus=1``), or per
    ``cpu_job_cpus`` CPUs for CPU jobs.

    ``address``: a running cluster (``"auto"``, ``"ray://host:10001"``) or None for this
    process's Ray (started locally if none is running). The snapshot travels with the job, so
    workers need no shared file system, only kernel_env installed. A job whose worker dies
    (killed, out of memory, node lost) is retried once on another worker, then answered with an
    error. At most as many jobs run as the cluster has slots; the rest wait here, in priority
    order, so final evaluations are not stuck behind a queue of verifications.
    """

    def __init__(self, address: str | None = None, *, cpu_job_cpus: int = 1,
                 max_in_flight: int | None = None, init_options: dict | None = None):
        import ray

        super().__init__()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_options or {}))
        self._ray = ray
        self.cpu_job_cpus = cpu_job_cpus
        resources = ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        slots = self.gpus or max(1, int(resources.get("CPU", 1)) // cpu_job_cpus)
        self.max_in_flight = max_in_flight or slots
        self._in_flight = 0
        self._threads = [threading.Thread(target=self._dispatch, name="kernel_env-ray-pool", daemon=True)]
        self._threads[0].start()

    _no_gpu_message = "the Ray cluster has no GPU: the job asks for device cuda"

    @property
    def has_gpu(self) -> bool:
        return self.gpus > 0

    def _dispatch(self) -> None:
        from kernel_env.runtime.ray_worker import evaluate_remote

        while True:
            with self._cv:
                while not self._closed and (not self._queue or self._in_flight >= self.max_in_flight):
                    self._cv.wait()
                if self._closed:
                    return
                _, _, job, future = heapq.heappop(self._queue)
                self._in_flight += 1
            if not future.set_running_or_notify_cancel():
                self._done()
                continue
            try:
                options = {"num_gpus": 1} if job.device == "cuda" else {"num_cpus": self.cpu_job_cpus}
                ref = evaluate_remote.options(max_retries=1, **options).remote(
                    job.model_copy(update={"snapshot_dir": Path()}), _pack(job.snapshot_dir))
            except Exception as exc:  # noqa: BLE001 - a cluster problem answers the job
                self._answer(job, future, _error(job, f"could not submit the job to Ray: {type(exc).__name__}: {exc}"))
                continue
            ref.future().add_done_callback(lambda done, job=job, future=future: self._answer(job, future, _unwrap(job, done)))

    def _answer(self, job: EvalJob, future: Future, result: EvalResult) -> None:
        future.set_result(result)
        self._done()

    def _done(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self._cv.notify()



def _pack(directory: Path) -> dict[str, bytes]:
    """The snapshot's files (the broker copied plain files only), to travel with the job."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _unwrap(job: EvalJob, done) -> EvalResult:
    try:
        return done.result()
    except Exception as exc:  # noqa: BLE001 - the worker died twice, or the cluster failed
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _error(job, f"the Ray worker running this job died twice ({type(exc).__name__}: {message})")


#: The step a job run again alone reports its first run under (its seconds), in ``EvalResult.steps_s``.
SHORT_OF_MEMORY_STEP = "run beside other jobs, short of device memory"


def _short_of_device_memory(result: EvalResult) -> bool:
    """Whether the job failed for want of device memory (torch's OutOfMemoryError, CUDA's
    cudaErrorMemoryAllocation: both say "out of memory")."""
    return result.device == "cuda" and "out of memory" in (result.error or "").lower()


def _error(job: EvalJob, message: str) -> EvalResult:
    """The answer to a job the evaluator could not evaluate (its fault: no reward)."""
    return EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                      mode=job.mode, correct=False, error=message, fault="evaluator", snapshot_hash=job.snapshot_hash)


def make_pool(kind: str = "local", **options) -> GpuPool:
    """A pool by kind: ``local`` (LocalPool) or ``ray`` (RayPool; ``address=...``)."""
    if kind == "local":
        return LocalPool(**options)
    if kind == "ray":
        return RayPool(**options)
    raise ValueError(f"unknown pool {kind!r}; available: local, ray")


# Pools are shared within a process by default: a timing is only honest when jobs on one device
# do not overlap, and many episodes must queue for the same devices.
_shared_lock = threading.Lock()
_shared: dict[str, GpuPool] = {}


def shared_pool(kind: str = "local") -> GpuPool:
    """This process's pool of a kind (``local``, ``ray``), created on first use."""
    with _shared_lock:
        if kind not in _shared:
            _shared[kind] = make_pool(kind)
        return _shared[kind]


def default_pool() -> GpuPool:
    return shared_pool("local")


__all__ = ["GpuPool", "LocalPool", "RayPool", "default_jobs_per_cpu", "default_jobs_per_gpu", "default_pool", "make_pool",
           "shared_pool", "visible_gpus"]
