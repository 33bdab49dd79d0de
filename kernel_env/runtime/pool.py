"""GPU evaluation pools: where trusted evaluation jobs run.

``GpuPool.submit(job) -> Future[EvalResult]``. The ``local`` pool runs several jobs on each visible
GPU at once (on the CPU when there is none), but never a timing run beside anything else on its
device (evaluators/sharing.py), and every job runs its code in fresh isolated child processes
(``kernel_env.evaluators.harness``): a CUDA fault, a hang or ``os._exit`` ends that job alone. The
``ray`` pool runs the same jobs on a Ray cluster, through one actor per GPU that runs a local pool of
its GPU (``DeviceWorker``). Jobs wait in a priority queue (final evaluations first, then FIFO).
Every job is answered with an EvalResult, never with an exception.

Why one module: the two pools share their queue and their answers, and the Ray pool's actor is a
local pool on the far side (an actor module of its own would import this one, and this one it).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kernel_env import config
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate, reserve_spares
from kernel_env.evaluators.records import EvalJob, EvalResult
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.evaluators.verdict import failed

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
            if future.running() or future.set_running_or_notify_cancel():  # running: queued again (RayPool's retry)
                future.set_result(_error(job, "the evaluation pool was closed before this job ran"))
        for thread in self._threads:
            thread.join(timeout=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalPool(_QueuedPool):
    """Workers for the devices of this machine.

    A GPU runs up to ``jobs_per_gpu`` jobs at once (``config.jobs_per_gpu()``), the CPU device
    ``jobs_per_cpu`` (``config.jobs_per_cpu()``): their untimed steps side by side and each
    timing run alone, under the device's ``DeviceLease`` (evaluators/sharing.py), the other jobs'
    processes frozen meanwhile. A job that runs out of device memory beside others is run again
    with the GPU to itself before it is answered (``_evaluate``)."""

    _no_gpu_message = "this pool has no GPU: the job asks for device cuda (use --device cpu for cpp or triton)"

    def __init__(self, devices: list[str] | None = None, *, baselines: BaselineCache | None = None,
                 jobs_per_gpu: int | None = None, jobs_per_cpu: int | None = None):
        present = ["cpu", *(gpus := visible_gpus())]
        if absent := [d for d in devices or [] if d not in present]:
            raise ValueError(f"{','.join(devices)}: this machine has no device {absent[0]!r} "
                             f"(it has {', '.join(present)})")
        if devices and len(set(devices)) < len(devices):  # named twice: two leases, overlapping timing runs
            raise ValueError(f"{','.join(devices)}: name each device once")
        super().__init__()
        self.devices = devices or gpus or ["cpu"]
        self.baselines = baselines or BaselineCache()
        self.jobs_per_gpu = jobs_per_gpu or config.jobs_per_gpu()
        self.jobs_per_cpu = jobs_per_cpu or config.jobs_per_cpu()
        slots = {d: self.jobs_per_gpu if d.startswith("cuda") else self.jobs_per_cpu for d in self.devices}
        #: The shared devices' leases, by device. The CPU's lease freezes a step mid-way at once (a frozen process leaves nothing running);
        # a GPU's lets a step run 0.1 s first (most end by then), and freezes none inside a call (sharing.py).
        self.leases = leases = {d: DeviceLease(grace_s=0.1 if d.startswith("cuda") else 0.0)
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

    def lease_accounts(self) -> dict[str, dict[str, float]]:
        """How each shared device's lease has spent its time, by state (a device of one slot has none)."""
        return {device: lease.account() for device, lease in self.leases.items()}

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
        """Evaluate the job, answering as soon as the result is complete (its processes end after that).
        On a shared GPU, a job that ran out of device memory is not answered but run again with the GPU
        to itself: the other jobs' memory may have been what it lacked, and an honest kernel must not be
        judged wrong for that. What the second run says is the answer."""
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
    """The same jobs on a Ray cluster: one actor per GPU (``DeviceWorker``), each running a local pool
    of its GPU, so ``jobs_per_gpu`` jobs share each GPU of the cluster as they share a local one (each
    timing run alone). A cluster without GPUs gets one actor per node, running ``jobs_per_cpu`` jobs.

    ``address``: a running cluster (``"auto"``, ``"ray://host:10001"``) or None for this process's Ray
    (started locally if none is running). The actors are named, in the ``kernel_env`` namespace, so every
    pool connected to the cluster (a trainer on each of several CPU hosts) sends its jobs to the same
    ones. This pool sends each actor at most its slots' worth of jobs and keeps the rest here, in priority
    order (final evaluations first); what several pools send beyond that waits in the actor's queue.

    Every ``refresh_s`` seconds, and at once when an actor is lost, the pool starts an actor for each
    device of the cluster's live nodes that has none. A job whose actor dies (killed, out of memory, its
    node lost) is run again once, then answered with an error (``fault="evaluator"``)."""

    _no_gpu_message = "the Ray cluster has no GPU: the job asks for device cuda"
    NAMESPACE = "kernel_env"

    def __init__(self, address: str | None = None, *, jobs_per_gpu: int | None = None, jobs_per_cpu: int | None = None,
                 refresh_s: float = 10.0, start_timeout_s: float = 120.0, init_options: dict | None = None):
        import ray

        super().__init__()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_options or {}))
        elif address or init_options:
            log.warning("Ray pool: Ray is already initialised in this process; its address and init options "
                        "are not used (ray.shutdown() first to connect elsewhere)")
        self._ray = ray
        self.jobs_per_gpu = jobs_per_gpu or config.jobs_per_gpu()
        self.jobs_per_cpu = jobs_per_cpu or config.jobs_per_cpu()
        self.refresh_s = refresh_s
        #: GPUs of the cluster's live nodes, when it was last looked at.
        self.gpus = 0
        self._had_gpu = False  # once it has, cuda jobs wait through a loss of every GPU node
        self._workers: dict[str, _RayWorker] = {}
        self._attempts: dict[str, int] = {}
        self._start_failures: dict[str, int] = {}
        self._lost_handles: list = []
        self._actor = ray.remote(DeviceWorker)
        self._refresh()
        self._refresh_at = time.monotonic() + refresh_s
        with self._cv:  # the actors a new cluster starts with: their first jobs need not wait for them
            if not self._cv.wait_for(lambda: all(w.ready for w in self._workers.values()), timeout=start_timeout_s):
                log.warning("Ray pool: %d of %d actors not started after %.0f s; jobs wait for them",
                            sum(not w.ready for w in self._workers.values()), len(self._workers), start_timeout_s)
        self._threads = [threading.Thread(target=self._dispatch, name="kernel_env-ray-pool", daemon=True)]
        self._threads[0].start()

    @property
    def has_gpu(self) -> bool:
        return self._had_gpu

    @property
    def slots(self) -> int:
        """Jobs the pool's started actors run at once."""
        with self._cv:
            return sum(w.slots for w in self._workers.values() if w.ready)

    def workers(self) -> list[dict]:
        """The pool's actors: name, whether started (``ready``), where (``host``, ``node``, ``device``,
        ``pid``: None until started), ``slots`` and this pool's jobs ``running`` on it. An actor that
        died idle shows as started until a job sent to it finds out."""
        with self._cv:
            return [{"name": w.name, "ready": w.ready, "slots": w.slots, "running": w.running,
                     **{key: w.where.get(key) for key in ("host", "node", "device", "pid")}}
                    for w in self._workers.values()]

    def lease_accounts(self) -> dict[str, dict[str, float]]:
        """Each started actor's device lease: how it has spent its time so far, by state, keyed by
        ``host/device`` (``LocalPool.lease_accounts``, from the actors)."""
        with self._cv:
            workers = [w for w in self._workers.values() if w.ready]
        found = {}
        for worker, ref in [(w, w.handle.lease_accounts.remote()) for w in workers]:
            try:
                accounts = self._ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - an actor lost meanwhile has no account to give
                continue
            found.update({f"{worker.where['host']}/{device}": account for device, account in accounts.items()})
        return found

    def _refresh(self) -> None:
        """Start an actor for each device of the cluster's live nodes that has none."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            nodes = [node for node in self._ray.nodes() if node.get("Alive")]
        except Exception as exc:  # noqa: BLE001 - the cluster is unreachable for now: try again later
            log.warning("Ray pool: could not list the cluster's nodes: %s", exc)
            return
        wanted = _devices(nodes)
        self.gpus = sum(gpu for _, gpu in wanted.values())
        self._had_gpu = self._had_gpu or self.gpus > 0
        with self._cv:
            for name in [name for name in self._workers if name not in wanted]:
                del self._workers[name]  # its node is gone, and the actor with it (a job on it is run again)
            missing = [name for name in wanted if name not in self._workers]
        created = []  # outside the lock: a Ray call must not wait on a Ray thread that waits on the lock
        for name in missing:
            node, gpu = wanted[name]
            jobs = self.jobs_per_gpu if gpu else self.jobs_per_cpu
            handle = self._actor.options(
                name=name, namespace=self.NAMESPACE, get_if_exists=True, num_gpus=int(gpu), num_cpus=0 if gpu else 1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(jobs)
            created.append(_RayWorker(name, handle, gpu, jobs))
        with self._cv:
            self._workers.update((worker.name, worker) for worker in created)
        for worker in created:
            started = worker.handle.ready.remote().future()
            started.add_done_callback(lambda done, worker=worker: self._started(worker, done))

    def _started(self, worker: _RayWorker, done) -> None:
        try:
            where = done.result()
        except Exception as exc:  # noqa: BLE001 - it could not start (its node lost, or its name still held by a dead one)
            with self._cv:
                failures = self._start_failures[worker.name] = self._start_failures.get(worker.name, 0) + 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("Ray pool: actor %s did not start (%d times): %s",
                                worker.name, failures, _first_line(exc))
                if self._workers.get(worker.name) is worker:
                    del self._workers[worker.name]
                # Soon after a loss (the dead actor's name may not be free yet), then less and less often.
                self._refresh_at = min(self._refresh_at, time.monotonic() + min(self.refresh_s, 0.5 * 2 ** failures))
                self._cv.notify_all()
            return
        with self._cv:
            self._start_failures.pop(worker.name, None)
            worker.where, worker.slots, worker.ready = where, where["jobs"], True
            self._cv.notify_all()

    def _dispatch(self) -> None:
        """Send queued jobs to actors with a free slot; kill lost actors; look at the cluster every
        ``refresh_s``. The only thread that calls Ray (its callbacks run on Ray's own threads, where
        a call to Ray can deadlock)."""
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        return
                    lost, self._lost_handles = self._lost_handles, []
                    refresh = time.monotonic() >= self._refresh_at
                    picked = None if lost or refresh else self._pick()
                    if lost or refresh or picked:
                        break
                    self._cv.wait(timeout=max(0.0, self._refresh_at - time.monotonic()))
            for handle in lost:  # if it lives on, unreachable, it must not hold its GPU
                with contextlib.suppress(Exception):
                    self._ray.kill(handle, no_restart=True)
            if refresh:
                self._refresh_at = time.monotonic() + self.refresh_s
                self._refresh()
            if picked is None:
                continue
            job, future, worker = picked
            try:
                sent = job.model_copy(update={"snapshot_dir": Path()})
                ref = worker.handle.evaluate.remote(sent, _pack(job.snapshot_dir))
            except Exception as exc:  # noqa: BLE001 - a cluster problem answers the job
                self._finish(worker)
                future.set_result(_error(job, f"could not send the job to Ray: {type(exc).__name__}: {exc}"))
                continue
            ref.future().add_done_callback(lambda done, job=job, future=future, worker=worker:
                                           self._answer(job, future, worker, done))

    def _pick(self) -> tuple[EvalJob, Future, _RayWorker] | None:
        """The first queued job, in priority order, that a started actor has a slot for, and the
        actor with the most free slots (call under the lock). A GPU's actor runs any job; a CPU's,
        only CPU jobs."""
        free = [w for w in self._workers.values() if w.ready and w.running < w.slots]
        while free and self._queue:
            if any(w.gpu for w in free):
                item = heapq.heappop(self._queue)
            else:
                item = next((i for i in sorted(self._queue) if i[2].device != "cuda"), None)
                if item is None:
                    return None
                self._queue.remove(item)
                heapq.heapify(self._queue)
            _, _, job, future = item
            if not (future.running() or future.set_running_or_notify_cancel()):  # cancelled while queued
                continue
            worker = max((w for w in free if w.gpu or job.device != "cuda"), key=lambda w: w.slots - w.running)
            worker.running += 1
            return job, future, worker
        return None

    def _finish(self, worker: _RayWorker) -> None:
        with self._cv:
            worker.running -= 1
            self._cv.notify_all()

    def _answer(self, job: EvalJob, future: Future, worker: _RayWorker, done) -> None:
        from ray.exceptions import RayError, RayTaskError

        try:
            result = done.result()
        except RayTaskError as exc:  # the actor's own code raised: a harness bug, not a lost worker
            result = _error(job, f"internal evaluation error on the Ray worker: {_first_line(exc)}")
        except RayError as exc:  # the actor died or cannot be reached: its node, its process, its memory
            result = self._lost(job, future, worker, exc)
        except Exception as exc:  # noqa: BLE001 - anything else still answers the job
            result = _error(job, f"the Ray pool could not get this job's result: {type(exc).__name__}: {exc}")
        self._finish(worker)
        if result is not None:
            self._attempts.pop(job.job_id, None)
            future.set_result(result)

    def _lost(self, job: EvalJob, future: Future, worker: _RayWorker, exc: Exception) -> EvalResult | None:
        """The job's actor was lost: forget it (and start another), and queue the job again once."""
        with self._cv:
            if self._workers.get(worker.name) is worker:
                del self._workers[worker.name]
                self._lost_handles.append(worker.handle)  # killed by the dispatcher (no Ray call in a Ray callback)
            self._refresh_at = 0.0
            attempts = self._attempts[job.job_id] = self._attempts.get(job.job_id, 0) + 1
            log.warning("Ray pool: actor %s lost with job %s (%s): %s", worker.name, job.job_id,
                        "running it again" if attempts < 2 else "its second loss: answered with an error",
                        _first_line(exc))
            if attempts < 2 and not self._closed:
                heapq.heappush(self._queue, (job.priority, -next(self._order), job, future))  # first of its priority
                self._cv.notify_all()
                return None
        return _error(job, f"the Ray worker running this job died twice ({type(exc).__name__}: {_first_line(exc)})")


@dataclass(eq=False)
class _RayWorker:
    """A RayPool's actor: its handle, and this pool's view of it."""

    name: str
    handle: object
    gpu: bool
    slots: int
    ready: bool = False
    running: int = 0
    where: dict = field(default_factory=dict)


def _devices(nodes: list[dict]) -> dict[str, tuple[str, bool]]:
    """The actors a cluster's live nodes call for, by name: (node id, whether it holds a GPU). One per
    GPU; on a cluster without GPUs, one per node with a CPU to give (a head started with
    ``--num-cpus=0`` runs none)."""
    gpus = {node["NodeID"]: int(node.get("Resources", {}).get("GPU", 0)) for node in nodes}
    if any(gpus.values()):
        return {f"{node}-gpu{index}": (node, True) for node, count in gpus.items() for index in range(count)}
    return {f"{node['NodeID']}-cpu": (node["NodeID"], False) for node in nodes
            if node.get("Resources", {}).get("CPU", 0) >= 1}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DeviceWorker:
    """The Ray actor behind RayPool (``ray.remote(DeviceWorker)``, made when a RayPool is): one
    device of the cluster, running a local pool of that device.

    A GPU's actor holds the GPU (``num_gpus=1``) and runs a ``LocalPool`` of it, given the physical
    GPU id (the harness starts its children with an environment of its own), so the jobs on one GPU
    of the cluster share it as on a local one, each timing run alone under the GPU's lease. On a
    cluster without GPUs there is one actor per node, for its CPU. The actor is asynchronous: what
    exceeds the local pool's slots waits in its queue, in priority order, whoever sent it. The
    snapshot travels with the job: no shared file system is needed.

    Ray starts its workers at niceness 15 and children inherit it: the evaluation's children would
    lose the processor to any busier process of the node, their launches timed slower. So the actor
    first brings its threads back to niceness 0 (``_unnice``).
    """

    def __init__(self, jobs: int) -> None:
        import ray

        _unnice()
        gpus = ray.get_gpu_ids()
        self.device = f"cuda:{int(gpus[0])}" if gpus else "cpu"
        self.pool = LocalPool([self.device], jobs_per_gpu=jobs, jobs_per_cpu=jobs)
        self.jobs = jobs

    async def ready(self) -> dict:
        """Where the actor runs, and how many jobs it runs at once."""
        import ray

        return {"device": self.device, "jobs": self.jobs, "pid": os.getpid(), "host": socket.gethostname(),
                "node": ray.get_runtime_context().get_node_id()}

    async def lease_accounts(self) -> dict[str, dict[str, float]]:
        return self.pool.lease_accounts()

    async def evaluate(self, job: EvalJob, snapshot: dict[str, bytes]) -> EvalResult:
        directory = await asyncio.to_thread(_unpack, job, snapshot)
        try:
            return await asyncio.wrap_future(self.pool.submit(job.model_copy(update={"snapshot_dir": directory})))
        finally:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)


def _unnice() -> None:
    """Every thread of this process at niceness 0 (Linux keeps it per thread; a thread started later
    inherits its starter's)."""
    try:
        for task in os.listdir("/proc/self/task"):
            os.setpriority(os.PRIO_PROCESS, int(task), 0)
    except OSError as exc:
        log.warning("the evaluation actor runs at niceness %d and cannot lower it (%s): its jobs may be timed slow "
                    "beside busier processes; start the cluster's nodes with RAY_worker_niceness=0", os.nice(0), exc)


def _unpack(job: EvalJob, snapshot: dict[str, bytes]) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=f"ray-snapshot-{job.job_id}-"))
    for relative, data in snapshot.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def _pack(directory: Path) -> dict[str, bytes]:
    """The snapshot's files (the broker copied plain files only), to travel with the job."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


#: The step a job run again alone reports its first run under (its seconds), in ``EvalResult.steps_s``.
SHORT_OF_MEMORY_STEP = "run beside other jobs, short of device memory"


#: How a failure for want of device memory reads: torch's OutOfMemoryError and the runtime's
#: cudaErrorMemoryAllocation ("out of memory"), the driver API's CUDA_ERROR_OUT_OF_MEMORY (the judge's
#: own buffers), cuBLAS's and cuDNN's STATUS_ALLOC_FAILED (a handle or workspace not allocated).
_OUT_OF_MEMORY = ("out of memory", "out_of_memory", "status_alloc_failed")


def _short_of_device_memory(result: EvalResult) -> bool:
    """Whether the job failed for want of device memory."""
    error = (result.error or "").lower()
    return result.device == "cuda" and any(marker in error for marker in _OUT_OF_MEMORY)


def _error(job: EvalJob, message: str) -> EvalResult:
    """The answer to a job the evaluator could not evaluate (its fault: no reward)."""
    return failed(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device, mode=job.mode,
                  error=message, fault="evaluator", snapshot_hash=job.snapshot_hash, margin=job.settings.speedup_margin)


def make_pool(kind: str = config.DEFAULT_POOL, **options) -> GpuPool:
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


def shared_pool(kind: str = config.DEFAULT_POOL) -> GpuPool:
    """This process's pool of a kind (``local``, ``ray``), created on first use."""
    with _shared_lock:
        if kind not in _shared:
            _shared[kind] = make_pool(kind)
        return _shared[kind]


def default_pool() -> GpuPool:
    return shared_pool("local")


__all__ = ["GpuPool", "LocalPool", "RayPool", "default_pool", "make_pool",
           "shared_pool", "visible_gpus"]
