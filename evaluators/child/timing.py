"""The one timing function: eager, torch.compile and candidates are all timed by ``time_calls``.

Per timed call: fresh inputs from their own seed (made outside the timed region), a cache
flush, a device-wide synchronise (the inputs are ready, nothing else runs), on CUDA the launch
cover, a start mark, the call, an end mark, then a device-wide synchronise:
the time is end - start, plus the work the call left running on other streams. On CUDA the
marks are device events on the device's default stream (the legacy stream, which every blocking
stream joins); on the CPU a monotonic clock.

Work left running on other streams is charged through the device-wide synchronise that follows,
timed on the host's clock: from the moment the host sees the end mark reached (it polls the
event) to the synchronise's return, less what that takes with nothing pending (the median of
idle readings taken after every call, plus ``_TAIL_SLACK_MS``). Both ends in a tight host loop
and the synchronise called without torch's Python device switch: the idle reading is 1.5-5 us
on an H100, against 14-49 us when the late work was read from an event recorded after the
synchronise (a launch's latency in every reading). Side-stream work shorter than a few
microseconds still goes free (docs/design.md, Known limits).

The launch cover is a spin kernel that takes every thread slot of every SM for a fixed time
(``launch_cover_us``) while the host launches the call, so the start mark is reached only once
the call's first kernels are queued behind it: up to that much host-side launch time (Python,
Triton's launcher) overlaps device work, as in a model whose GPU runs ahead of the host, and
no longer decides the measurement (without it, Triton candidates spread by 60 % across jobs
on a busy host). Because the cover fills the whole device, nothing the call launches, on any
stream, can run before the start mark: work on a side stream that does not wait for the
current one queues behind the cover like the rest. Host time beyond the cover, and any call
that waits for the host (a synchronise, a copy to the CPU), is timed.

Seeds may arrive one at a time (``seeds`` is any iterable): the evaluation child receives each
timed call's seed only after the call before it has ended, so no call's inputs exist in the
process before that call (nothing to compute ahead of time and hand back later).

This module runs inside the evaluation child processes. The primitives it uses are bound
when it is imported, which is before any candidate code is: replacing ``torch.cuda.Event``
or ``time.perf_counter`` afterwards does not change what it measures (and the integrity
check reports the replacement).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import globaltimer as _globaltimer
except ImportError:  # no Triton: no launch cover (the launch is then timed, never hidden)
    triton = None

_perf_counter_ns = time.perf_counter_ns
_EventBase = torch._C._CudaEventBase if hasattr(torch._C, "_CudaEventBase") else None
_cuda_synchronize = torch.cuda.synchronize
# The synchronise itself, without torch.cuda.synchronize's device switch in Python (a few
# microseconds that would widen the late-work allowance): for the current device only.
_raw_synchronize = torch._C._cuda_synchronize if hasattr(torch._C, "_cuda_synchronize") else None
_current_device = torch.cuda.current_device
_default_stream = torch.cuda.default_stream
_set_stream = torch.cuda.set_stream
_randint = torch.randint
_Generator = torch.Generator

FINGERPRINT_SAMPLES = 64
#: Bumped whenever a change here changes what a timing means; part of the baseline cache key.
PROTOCOL_VERSION = 6
_AUDIT_SEED_SALT = 0x5BD1E995
# The host-clock backstop charges late work beyond the median idle synchronise plus this: on an
# H100 the idle readings' median was 1.5-5 us and honest calls read up to ~2 us above it.
_TAIL_SLACK_MS = 3e-3
# After launching the cover, the host waits this long before it marks the start and calls the
# candidate, so the cover's blocks hold every SM before anything of the call can be launched.
_COVER_SETTLE_NS = 30_000
_COVER_WARPS = 16  # 512 threads a block: several blocks fill an SM's thread slots exactly
#: The cover kernel's name, by which the device record (guards.DeviceRecord) places an audited call's start on its clock.
COVER_KERNEL = "kernel_env_launch_cover"
#: The kernel an audited call's end mark is followed by on the default stream: the record places the end by it.
END_KERNEL = "kernel_env_end_mark"
#: The launch cover of an audited call (microseconds, at least): see Bench.
AUDIT_COVER_US = 1000.0


if triton is not None:
    @triton.jit(do_not_specialize=["duration_ns"])
    def kernel_env_launch_cover(deadline_ptr, duration_ns):  # the name is COVER_KERNEL: the device record finds it by it
        # The first block to start sets the deadline (the slot is zero before each launch) and every
        # block spins until that same reading of the global timer: all leave their SMs at once. A
        # deadline of each block's own (tried first) freed SMs one by one while the last blocks
        # still held the timing stream, and on an H100 a side-stream kernel got a third of its work
        # done before the start mark.
        tl.atomic_cas(deadline_ptr, tl.full([], 0, tl.int64), _globaltimer() + duration_ns)  # one thread a block
        tl.debug_barrier()  # the block's other threads read the deadline only after that thread's swap
        deadline = tl.load(deadline_ptr, volatile=True)
        now = _globaltimer()
        while now < deadline:
            now = _globaltimer()

    @triton.jit
    def kernel_env_end_mark(deadline_ptr):  # the name is END_KERNEL: the device record finds it by it
        pass


def preload() -> None:
    """Make the harness's two kernels (the launch cover and the end mark) ready to launch on this
    process's GPU: compiled, loaded, and their launchers built (a C compile each), so the first
    bench a job makes finds them ready. The fork server (zygote.py) runs it once in a child of
    its own to fill the Triton cache every child gets a copy of (the compiles took 1.5-1.7 s and
    the launchers 0.5 s on an H100 machine); a spare (children.Spares) runs it before any job or
    candidate code, and then only loads them. It makes the process's CUDA context (about 0.5 GB
    of the GPU's memory per spare); a failure here is the bench's to meet and report later."""
    if triton is None or not os.environ.get("CUDA_VISIBLE_DEVICES") or not torch.cuda.is_available():
        return
    try:
        LaunchCover(torch.device("cuda", 0), 1.0)  # launches each once, which builds everything
    except Exception:  # noqa: BLE001 - the job's bench tries again, and reports what goes wrong then
        pass


class _Marks:
    """Start/end marks on one device: CUDA events, or the CPU's monotonic clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._raw = self.cuda and _raw_synchronize is not None and _current_device() == (device.index or 0)
        self.stream = _default_stream(device) if self.cuda else None

    def use_default_stream(self) -> None:
        """Make the default stream current (a call may have left another current)."""
        if self.cuda:
            _set_stream(self.stream)

    def sync(self) -> None:
        if self._raw:
            _raw_synchronize()
        elif self.cuda:
            _cuda_synchronize(self.device)

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            _EventBase.record(event, self.stream)
            return event
        return _perf_counter_ns()

    def wait(self, event) -> None:
        """Return as soon as ``event`` is reached (polled, so the host sees it within a microsecond or two)."""
        if self.cuda:
            while not _EventBase.query(event):
                pass

    def late_ms(self, end) -> float:
        """Milliseconds a device-wide synchronise waits once the host has seen ``end`` reached: work
        still running on other streams, plus the synchronise's own cost."""
        self.wait(end)
        observed = _perf_counter_ns()
        self.sync()
        return (_perf_counter_ns() - observed) / 1e6

    def elapsed_ms(self, start, end) -> float:
        if self.cuda:
            _EventBase.synchronize(end)
            return float(_EventBase.elapsed_time(start, end))
        return (end - start) / 1e6


class LaunchCover:
    """A spin kernel holding every thread slot of every SM of the device for ``microseconds``.

    Where it cannot fill every SM (no Triton; a kernel too large in registers) there is no
    cover: the call's launch is then timed, which is slower but never hides any work."""

    def __init__(self, device: torch.device, microseconds: float):
        self.duration_ns = int(microseconds * 1e3)
        self.grid = 0
        if device.type != "cuda" or self.duration_ns <= 0 or triton is None:
            return
        props = torch.cuda.get_device_properties(device)
        threads = getattr(props, "max_threads_per_multi_processor", 2048)
        per_block = _COVER_WARPS * 32
        self.deadline = torch.zeros(1, dtype=torch.int64, device=device)
        kernel = kernel_env_launch_cover[(1,)](self.deadline, 0, num_warps=_COVER_WARPS)  # compiles and loads it; no wait
        kernel_env_end_mark[(1,)](self.deadline)  # likewise
        _cuda_synchronize(device)
        registers = int(getattr(kernel, "n_regs", 0) or 0) * threads
        if threads % per_block == 0 and registers <= getattr(props, "regs_per_multiprocessor", 65536):
            self.grid = props.multi_processor_count * (threads // per_block)

    def __call__(self, microseconds: float | None = None) -> None:
        """Launch the cover (for ``microseconds``, else the length it was made with) and wait until it holds the device."""
        if self.grid:
            self.deadline.zero_()
            duration_ns = self.duration_ns if microseconds is None else int(microseconds * 1e3)
            kernel_env_launch_cover[(self.grid,)](self.deadline, duration_ns, num_warps=_COVER_WARPS)
            settle = _perf_counter_ns() + _COVER_SETTLE_NS
            while _perf_counter_ns() < settle:
                pass

    def end_mark(self) -> None:
        """Launch the end-mark kernel on the current stream (the default one, after an audited
        call's end mark): the device record places the call's end where it starts."""
        if self.grid:
            kernel_env_end_mark[(1,)](self.deadline)


def flatten(value) -> list:
    """A call's outputs, read without running any of its code: the items of a tuple or list, nested
    ones included (a subclass's through the base type's own iterator, so an ``__iter__`` of the
    candidate's cannot compute the outputs when the harness reads them, after the audit and the end
    mark), else the one value. The real type decides, not ``isinstance``, which a ``__class__``
    property fools."""
    kind = type(value)
    if issubclass(kind, tuple):
        items = tuple.__iter__(value)
    elif issubclass(kind, list):
        items = list.__iter__(value)
    else:
        return [value]
    return [leaf for item in items for leaf in flatten(item)]


def is_sequence(value) -> bool:
    """Whether ``flatten`` reads ``value`` as several outputs (by its real type)."""
    return issubclass(type(value), (tuple, list))


def is_plain(value) -> bool:
    """A tensor with nothing of its own: ``torch.Tensor`` itself, or a module's ``Parameter`` returned as
    is, with no attribute set on it (one named like a method, ``out.to = ...``, would answer the
    harness's own reads of the output with the candidate's code)."""
    return type(value) in (torch.Tensor, torch.nn.Parameter) and not _instance_dict(value)


def describe(value) -> str:
    """What a non-plain output is, for the message."""
    attributes = _instance_dict(value) if isinstance(value, torch.Tensor) else {}
    if attributes and type(value) in (torch.Tensor, torch.nn.Parameter):
        return f"a {type(value).__name__} with attributes set on it ({', '.join(sorted(attributes)[:3])})"
    return type(value).__name__


def _instance_dict(value) -> dict:
    try:
        return object.__getattribute__(value, "__dict__")
    except AttributeError:
        return {}


def fingerprint(output, fp_seed: int) -> list[dict]:
    """A cheap summary of each output tensor: its size, sampled elements and sum of magnitudes."""
    summary = []
    generator = _Generator().manual_seed(fp_seed)
    for tensor in flatten(output):
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            summary.append({"plain": is_plain(tensor), "numel": 0, "samples": [], "abs_sum": 0.0})
            continue
        flat = tensor.detach().reshape(-1)
        index = _randint(0, flat.numel(), (FINGERPRINT_SAMPLES,), generator=generator).to(flat.device)
        summary.append({
            "plain": is_plain(tensor),  # a subclass could compute lazily, after the end mark
            "numel": flat.numel(),
            "samples": flat[index].double().cpu().tolist(),
            "abs_sum": float(flat.double().abs().nansum().cpu()),
        })
    return summary


def fingerprints_match(expected: list[dict], got: list[dict], atol: float, rtol: float) -> bool:
    """Same sizes, sampled elements within atol/rtol (NaN only where expected), sums within the summed tolerance."""
    if len(expected) != len(got):
        return False
    for e, g in zip(expected, got):
        if e["numel"] != g["numel"] or len(e["samples"]) != len(g["samples"]):
            return False
        for ev, gv in zip(e["samples"], g["samples"]):
            if math.isnan(ev) or math.isnan(gv) or math.isinf(ev) or math.isinf(gv):
                if not (ev == gv or (math.isnan(ev) and math.isnan(gv))):
                    return False
            elif abs(ev - gv) > atol + rtol * abs(ev):
                return False
        if abs(e["abs_sum"] - g["abs_sum"]) > e["numel"] * atol + rtol * abs(e["abs_sum"]):
            return False
    return True


def poison(output, spare: frozenset[int] = frozenset()) -> None:
    """Overwrite returned floating-point outputs with NaN once they have been checked, but for those
    in the storages ``spare`` names (a module's own weights and buffers, which an output may be a view
    of: a reference returning ``self.cos_cached[:n]`` must not find NaN there in its next call)."""
    for tensor in flatten(output):
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and _storage(tensor) not in spare:
            try:
                tensor.detach().fill_(float("nan"))
            except RuntimeError:
                pass


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:  # no storage of its own (a subclass, a meta tensor)
        return 0


def module_storages(module: torch.nn.Module) -> frozenset[int]:
    """The storages of a module's weights and buffers, which ``poison`` spares."""
    return frozenset(_storage(t) for t in (*module.parameters(), *module.buffers())) - {0}


class Bench:
    """One device's measuring bench: the marks, the cache flush and the launch cover.

    ``ready()`` is how the device is left for every timed and audited call alike (so an audited
    call cannot be told from a timed one by asking whether the stream is busy): caches flushed,
    the inputs ready and nothing else running, then the cover filling the device while the call
    launches. An audited call gets a longer cover (``AUDIT_COVER_US``): the device record it runs
    under slows the host's launches (a Triton launch took 57 us instead of 38 on an H100), and
    the call must still be queued whole behind the cover when the device starts it, as a timed
    call is."""

    def __init__(self, device: torch.device, *, flush_bytes: int = 0, launch_cover_us: float = 0.0):
        self.marks = _Marks(device)
        self.flush = torch.empty(max(flush_bytes // 4, 1), dtype=torch.float32, device=device)
        self.cover = LaunchCover(device, launch_cover_us)

    def ready(self, *, audited: bool = False) -> None:
        self.flush.zero_()
        self.marks.sync()
        self.cover(max(self.cover.duration_ns / 1e3, AUDIT_COVER_US) if audited else None)

    def audited_end(self) -> None:
        """After an audited call's end mark: the end-mark kernel on the default stream (the call
        may have left another stream current), which the device record places the call's end by."""
        self.marks.use_default_stream()
        self.cover.end_mark()


def time_calls(
    fn: Callable, make_inputs: Callable[[int], list], seeds: Iterable[int], device: torch.device, *,
    warmup_seeds: Sequence[int] = (), flush_bytes: int = 256 << 20, launch_cover_us: float = 0.0, fp_seed: int = 0,
    signal: Callable[[str, int], None] | None = None,
    audit: Callable[[list, Bench], None] | None = None, audit_at: Sequence[int] = (), details: dict | None = None,
    after_call: Callable[[], None] | None = None, spare: frozenset[int] = frozenset(),
) -> tuple[list[float], list[list[dict]]]:
    """Milliseconds of each timed call, and each call's output fingerprint.

    ``signal("start"|"end", k)`` is called just before the start mark and just after the end
    mark of call k: the evaluation child forwards these to the trusted parent, whose own
    clock then brackets every timed call. ``audit(inputs, bench)`` runs an extra, untimed call
    on fresh inputs after each call whose index is in ``audit_at``, so rule checks reach the
    timing run at positions the code under test cannot predict; it gets the device ready with
    ``bench.ready(audited=True)`` itself, under whatever it watches the call with.
    ``after_call()`` runs after every timed call's end signal, outside the measurement (the
    candidate's process watch). ``spare``: storages ``poison`` leaves alone (``module_storages``).

    ``details``, when given, is filled with what each timing is made of, for diagnosis (nothing
    decides on it): ``launch_us`` (host time from the start mark until the call returned, which
    the launch cover hides up to its length), ``tail_ms`` (what the device-wide synchronise waited once the
    end mark was reached, on the host's clock), ``idle_tail_ms`` (the same after a cache flush
    instead of a call, right after each call), ``allowance_ms`` (the idle tail late work is
    charged beyond) and ``charged_ms`` (the time added for late work).
    """
    bench = Bench(device, flush_bytes=flush_bytes, launch_cover_us=launch_cover_us)
    marks = bench.marks
    with torch.no_grad():
        for seed in warmup_seeds:
            marks.use_default_stream()
            out = fn(*make_inputs(seed))
            marks.sync()
            poison(out, spare)
            del out
        idle_before = _idle_tails(bench, rounds=10)
        idle_after = []  # one reading after each call
        own, tails, launches, prints = [], [], [], []
        for index, seed in enumerate(seeds):
            marks.use_default_stream()
            inputs = make_inputs(seed)
            bench.ready()
            if signal:
                signal("start", index)
            start = marks.mark()
            launched = _perf_counter_ns()
            out = fn(*inputs)
            returned = _perf_counter_ns()
            end = marks.mark()
            tails.append(marks.late_ms(end))  # returns with the device idle
            own.append(marks.elapsed_ms(start, end))
            if signal:
                signal("end", index)
            # The output is read at once: work that finishes it later (a thread of the call's own,
            # past every rule) would otherwise have the harness's steps below to do it in, unseen.
            prints.append(fingerprint(out, fp_seed))
            poison(out, spare)
            if after_call is not None:
                after_call()
            launches.append((returned - launched) / 1e3)
            idle_after += _idle_tails(bench, rounds=1)
            del out, inputs
            if audit is not None and index in audit_at:
                marks.use_default_stream()
                inputs = make_inputs(seed ^ _AUDIT_SEED_SALT)  # inputs of their own: not a repeat of the timed call
                audit(inputs, bench)
                marks.sync()
                del inputs
    allowance = statistics.median(idle_before + idle_after) + _TAIL_SLACK_MS
    charged = [max(0.0, tail - allowance) for tail in tails]
    if details is not None:
        details.update(launch_us=launches, tail_ms=tails, idle_tail_ms=idle_after,
                       allowance_ms=allowance, charged_ms=charged)
    return [t + c for t, c in zip(own, charged)], prints


#: A tiny kernel's launch and completion takes ~20 us on an idle H100; a device time-shared with
#: another process's running kernel makes it wait for that process's time slice (milliseconds).
_BUSY_MS = 0.5


def other_work_ms(device: torch.device, rounds: int = 5) -> float | None:
    """Milliseconds a tiny kernel waited to run and finish (median of ``rounds``) when another
    process's work holds the device, else None: before a timing run on a device shared with
    other jobs, whose processes are frozen but whose kernels already launched run on."""
    if device.type != "cuda":
        return None
    probe = torch.zeros(1, device=device)
    walls = []
    for _ in range(rounds):
        began = _perf_counter_ns()
        probe.add_(1)
        _cuda_synchronize(device)
        walls.append((_perf_counter_ns() - began) / 1e6)
    wall = statistics.median(walls)
    return wall if wall > _BUSY_MS else None


def _idle_tails(bench: Bench, rounds: int) -> list[float]:
    """What ``late_ms`` reads when nothing is pending (after a cache flush, as after a call)."""
    tails = []
    for _ in range(rounds):
        bench.flush.zero_()
        tails.append(bench.marks.late_ms(bench.marks.mark()))
    return tails
