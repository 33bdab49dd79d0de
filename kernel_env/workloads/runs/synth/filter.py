"""Filter: run each candidate task in the evaluation's isolated judge process; keep the usable ones.

A candidate is kept when all of these hold, checked in this order (the cheap ones first): it
imports and runs; ``forward`` returns tensors, all finite; the same inputs twice give the same
outputs; no output is constant, and different inputs give different outputs; its eager time lies
within ``FilterSettings.bounds()`` ([1, 100] ms on a GPU, ``CPU_TIME_SCALE`` times that on the
CPU); ``torch.compile(Model)`` runs and agrees with eager. The checks, the bounds and the parallel
screening: docs/tasks.md, Synthesis (step 4).

- ``filter_tasks``: screen ``(task_id, code)`` pairs; ``Screener``: the same, one ``submit`` each.
- ``screen``: judge one task; ``FilterSettings``, ``Screening``, ``FilterError``.

Before touching it: the candidate's code runs only in a judge child (``evaluators.children.Child``:
its own namespaces, no network, resource limits), never in this process; the child reports facts,
this module decides. Timing holds the device alone (``DeviceLease``); torch.compile runs outside
the lease, since a timer waiting for minutes of compiling would stall every screening behind it.
A candidate whose process died or hung is rejected only after a trivial task's process is seen to
work (else the machine is at fault: FilterError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_env.config import DEFAULT_ATOL, DEFAULT_RTOL
from kernel_env.evaluators.child.protocol import RefInit, RefScreen, RefTime, RefTimeAnswer, Setup, SetupAnswer
from kernel_env.evaluators.children import Child, ChildError, CommandFailed
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.sandbox.bwrap import bubblewrap_problem

GPU_BOUNDS_MS = (1.0, 100.0)
#: CPU eager times are judged against GPU_BOUNDS_MS scaled by this factor: a server CPU streams memory
#: at 50-100 GB/s against an H100's 3 TB/s and computes fp32 some tens of times slower, so a task takes
#: roughly 30-100 times longer there. A rough factor for a rough machine class: pass explicit bounds
#: (``min_ms``, ``max_ms``) where it matters.
CPU_TIME_SCALE = 50.0
_INPUT_SEEDS = (1234, 5678)
_CANARY = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.randn(2)]


def get_init_inputs():
    return []
"""
_INIT_SEED = 42


class FilterError(RuntimeError):
    """The filter cannot run here (no GPU for --device cuda); the message says what to do."""


@dataclass(frozen=True)
class FilterSettings:
    """How candidates are judged. ``min_ms``/``max_ms`` default to GPU_BOUNDS_MS, scaled by
    CPU_TIME_SCALE on the CPU. Tolerances are relative to ``1 + the outputs' largest magnitude``."""

    device: str = "cpu"
    min_ms: float | None = None
    max_ms: float | None = None
    timed_calls: int = 10
    warmup_calls: int = 2
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    repeat_tolerance: float = 1e-6
    distinct_tolerance: float = 1e-6
    flush_bytes: int = 256 << 20
    step_timeout_s: float = 300.0
    compile_timeout_s: float = 900.0
    jobs_per_device: int = 1
    compile_threads: int = 0  # inductor's compile workers per process (0: its default, one per CPU)

    def bounds(self) -> tuple[float, float]:
        scale = CPU_TIME_SCALE if self.device == "cpu" else 1.0
        low = self.min_ms if self.min_ms is not None else GPU_BOUNDS_MS[0] * scale
        high = self.max_ms if self.max_ms is not None else GPU_BOUNDS_MS[1] * scale
        return low, high

    def describe(self) -> dict[str, Any]:
        low, high = self.bounds()
        return {"device": self.device, "min_ms": low, "max_ms": high, "timed_calls": self.timed_calls,
                "atol": self.atol, "rtol": self.rtol, "repeat_tolerance": self.repeat_tolerance,
                "distinct_tolerance": self.distinct_tolerance}


@dataclass
class Screening:
    """What the filter found for one task: kept, or the reasons it was not."""

    task_id: str
    kept: bool
    reasons: list[str] = field(default_factory=list)
    eager_ms: float | None = None
    outputs: list[dict] = field(default_factory=list)
    device_name: str = ""
    seconds: float = 0.0
    crashed: bool = False          # the process died or hung (the task's doing, or this machine's)
    out_of_memory: bool = False    # maybe only because other screenings shared the device

    def to_record(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "kept": self.kept, "reasons": self.reasons, "eager_ms": self.eager_ms,
                "outputs": self.outputs, "device_name": self.device_name, "seconds": self.seconds,
                "crashed": self.crashed}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Screening:
        return cls(task_id=record["task_id"], kept=bool(record["kept"]), reasons=list(record.get("reasons") or []),
                   eager_ms=record.get("eager_ms"), outputs=list(record.get("outputs") or []),
                   device_name=str(record.get("device_name") or ""), seconds=float(record.get("seconds") or 0.0),
                   crashed=bool(record.get("crashed")))


class _Rejected(Exception):
    pass


def _first_line(text: str | None, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0].rstrip(":") if (text or "").strip() else "no details"
    return line if len(line) <= limit else line[:limit] + "…"


def screen(code: str, task_id: str, settings: FilterSettings, *, device: str = "cpu", gate: DeviceLease | None = None,
           cache_dir: Path | None = None, on_child: Any = None, canary: bool = False) -> Screening:
    """Judge one task (its whole source) on ``device`` (``cuda:N`` or ``cpu``). Never raises for
    anything the task does: every failure is a reason in the Screening. ``on_child(child)`` is
    called with the child process once it runs (so a caller can kill it on interrupt).
    ``canary``: only start the process and import the task (a check of this machine)."""
    started = time.monotonic()
    gate = gate or DeviceLease()
    result = Screening(task_id=task_id, kept=False)
    gpu = device.startswith("cuda")
    env = {"CUDA_VISIBLE_DEVICES": device.split(":")[1] if gpu else ""}
    if settings.compile_threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(settings.compile_threads)
    shared = {}
    if cache_dir is not None:
        cache_dir = cache_dir.resolve()  # bubblewrap binds need absolute paths
        cache_dir.mkdir(parents=True, exist_ok=True)
        shared["/job/cache"] = cache_dir
        inside = "/job/cache" if bubblewrap_problem() is None else str(cache_dir)
        env |= {"TORCHINDUCTOR_CACHE_DIR": f"{inside}/inductor", "TRITON_CACHE_DIR": f"{inside}/triton"}
    child = None
    try:
        child = Child.spawn("judge", env=env, gpu=gpu, label="synth-screen", shared=shared)
        if on_child is not None:
            on_child(child)
        if canary:
            _ask(child, Setup(device="cuda:0" if gpu else "cpu", out_dir=child.path("/job/ref"), task_code=code), None,
                 "starting it", settings.step_timeout_s, result, log_tail=True)
        else:
            _judge(child, code, settings, gate, result, "cuda:0" if gpu else "cpu")
        result.kept = not result.reasons
    except _Rejected:
        pass
    finally:
        if child is not None:
            child.discard()
        result.seconds = round(time.monotonic() - started, 3)
    return result


def _ask(child: Child, command, answer, doing: str, timeout: float, result: Screening, *, log_tail: bool = False):
    try:
        return child.call(command, answer, timeout)
    except ChildError as exc:
        detail = " ".join(str(exc).split()) if log_tail else _first_line(str(exc))
        result.reasons.append(f"{doing} failed: {detail}")
        result.crashed = True
        raise _Rejected from None
    except CommandFailed as exc:
        # the runner's command is no news
        error = _first_line(str(exc)).removeprefix(f"{type(command).__name__} raised ")
        result.reasons.append(f"{doing} failed: {error}")
        result.out_of_memory = "out of memory" in error.lower()
        raise _Rejected from None


def _judge(child: Child, code: str, s: FilterSettings, gate: DeviceLease, result: Screening, child_device: str) -> None:
    timeout = s.step_timeout_s
    with gate.untimed():
        setup = _ask(child, Setup(device=child_device, out_dir=child.path("/job/ref"), task_code=code), SetupAnswer,
                     "importing the task", timeout, result)
        result.device_name = setup.device_name
        _ask(child, RefInit(init_seed=_INIT_SEED), None, "building Model(*get_init_inputs())", timeout, result)
        facts = _ask(child, RefScreen(seeds=list(_INPUT_SEEDS)), None, "running Model.forward", timeout, result)
    if facts["non_tensor_outputs"]:
        result.reasons.append(f"Model.forward returns {', '.join(facts['non_tensor_outputs'])}, not tensors")
        raise _Rejected
    result.outputs = facts["outputs"]
    scale = 1.0 + facts["scale"]
    if not facts["finite"]:
        result.reasons.append("the outputs hold NaN or Inf")
    if facts["repeat_max_diff"] > s.repeat_tolerance * scale:
        result.reasons.append(f"not deterministic: the same inputs twice gave outputs {facts['repeat_max_diff']:.3g} apart "
                              "(a stochastic operator?)")
    if any(n > 1 and spread == 0 for n, spread in zip(facts["numels"], facts["spreads"])):
        result.reasons.append("an output is constant (all its elements are equal)")
    if facts["input_max_diff"] <= s.distinct_tolerance * scale:
        result.reasons.append("the outputs do not depend on the inputs (two different inputs gave the same outputs)")
    if result.reasons:
        raise _Rejected
    low, high = s.bounds()
    flush = s.flush_bytes if child_device.startswith("cuda") else min(s.flush_bytes, 32 << 20)
    with gate.timing():
        times = _ask(child, RefTime(calls=s.timed_calls, warmup=s.warmup_calls, flush_bytes=flush), RefTimeAnswer,
                     "timing the eager Model", s.compile_timeout_s, result).times_ms["eager"]
    result.eager_ms = round(statistics.median(times), 6)
    if not low <= result.eager_ms <= high:
        where = "too fast" if result.eager_ms < low else "too slow"
        result.reasons.append(f"{where}: eager time {result.eager_ms:.4g} ms is outside [{low:g}, {high:g}] ms")
        raise _Rejected
    # Outside the gate: compiling is CPU work that lasts seconds to minutes, and a timer waiting
    # for it would hold every other screening back (a convoy). Its two short runs on the device
    # may overlap another task's timing, which its median of ten calls absorbs.
    compiled = _ask(child, RefScreen(seeds=list(_INPUT_SEEDS), compile=True), None, "running torch.compile(Model)",
                    s.compile_timeout_s, result)
    allowed = s.atol + s.rtol * compiled["scale"]
    if compiled["compile_max_diff"] > allowed:
        result.reasons.append(f"torch.compile(Model) disagrees with eager: max difference "
                              f"{compiled['compile_max_diff']:.3g} (allowed {allowed:.3g})")


def _visible_gpus() -> list[str]:
    from kernel_env.runtime.pool import visible_gpus

    return visible_gpus()


class Screener:
    """Screens tasks on this machine's devices (every visible GPU for cuda, else the CPU),
    ``jobs_per_device`` at once per device. ``submit`` returns a future of the Screening."""

    def __init__(self, settings: FilterSettings, *, cache_dir: Path | None = None):
        devices = _visible_gpus() if settings.device == "cuda" else ["cpu"]
        if not devices:
            raise FilterError("no GPU is visible here: the filter cannot time on cuda (use --device cpu)")
        self.devices = devices
        self.workers = len(devices) * max(1, settings.jobs_per_device)
        if not settings.compile_threads:  # share the CPUs among the processes compiling at once
            settings = dataclasses.replace(settings, compile_threads=max(1, (os.cpu_count() or 1) // self.workers))
        self.settings = settings
        self._own_cache = cache_dir is None
        self.cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="synth-compile-cache-"))
        self._gates = {d: DeviceLease() for d in devices}
        # Held as a sharer (untimed) by every screening for the life of its process, alone (timing) by
        # a retry after running out of memory: only then is the device's memory free of other
        # processes' contexts and caches (a timing gate does not free what a waiting process holds).
        self._occupancy = {d: DeviceLease() for d in devices}
        self._slots: queue.Queue[str] = queue.Queue()
        for _ in range(max(1, settings.jobs_per_device)):
            for d in devices:
                self._slots.put(d)
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="synth-filter")
        self._children: set[Child] = set()
        self._lock = threading.Lock()
        self._closing = False

    def _check_isolation(self, device: str) -> None:
        """Start one isolated reference process on a trivial task. Run when a screening's process
        died or hung: if this fails too, the machine is at fault, not the candidate, and rejecting
        it (and every candidate after it) would be wrong. Raises FilterError."""
        probe = screen(_CANARY, "filter-canary", self.settings, device=device, cache_dir=self.cache_dir, canary=True)
        if probe.reasons:
            raise FilterError(f"the filter's isolated evaluation process does not work here: {probe.reasons[0]}")

    def submit(self, code: str, task_id: str) -> Future[Screening]:
        """Queue a screening. Its future raises FilterError (and holds no Screening) if the task's
        process died and a trivial task's process dies too: this machine cannot run the filter."""
        return self._executor.submit(self._run, code, task_id)

    def _run(self, code: str, task_id: str) -> Screening:
        device = self._slots.get()
        holder: list[Child] = []

        def remember(child: Child) -> None:
            holder.append(child)
            with self._lock:
                self._children.add(child)

        try:
            with self._occupancy[device].untimed():
                result = screen(code, task_id, self.settings, device=device, gate=self._gates[device],
                                cache_dir=self.cache_dir, on_child=remember)
            if self._closing:
                return result  # killed by close(abort=True): no verdict anyone will record
            if result.crashed:
                self._check_isolation(device)
            if result.out_of_memory and self.workers > 1:
                # Other screenings' processes held memory on this device: judge it again once none is
                # left, with the device to itself.
                with self._occupancy[device].timing(drain=True):  # every other screening has ended
                    result = screen(code, task_id, self.settings, device=device, gate=DeviceLease(),
                                    cache_dir=self.cache_dir, on_child=remember)
            return result
        finally:
            with self._lock:
                self._children.difference_update(holder)
            self._slots.put(device)

    def close(self, *, abort: bool = False) -> None:
        """Wait for running screenings (``abort``: kill their processes first); drop queued ones."""
        if abort:
            self._closing = True
            with self._lock:
                children = list(self._children)
            for child in children:
                with contextlib.suppress(Exception):
                    child.kill()
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def __enter__(self) -> Screener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(abort=exc[0] is not None)


def filter_tasks(tasks: Sequence[tuple[str, str]], settings: FilterSettings, *,
                 cache_dir: Path | None = None) -> list[Screening]:
    """Screen ``(task_id, code)`` pairs in parallel; the Screenings in the same order."""
    with Screener(settings, cache_dir=cache_dir) as screener:
        futures = [screener.submit(code, task_id) for task_id, code in tasks]
        return [future.result() for future in futures]
