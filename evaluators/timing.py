"""The one timing function: eager, torch.compile and candidates are all timed by ``time_calls``.

Per timed call: fresh inputs from their own seed (made outside the timed region), a cache
flush, a start mark, the call, an end mark, then a device-wide synchronise and a last mark:
the time is end - start, plus whatever the device-wide synchronise waited for beyond its
usual latency (work the call left on side streams counts). On CUDA the marks are device
events; on the CPU a monotonic clock. Each call's output is fingerprinted (so the trusted parent can
check that timed calls computed the right thing) and then poisoned with NaN (so the next
call cannot hand the same memory back as its answer).

This module runs inside the evaluation child processes. The primitives it uses are bound
when it is imported, which is before any candidate code is: replacing ``torch.cuda.Event``
or ``time.perf_counter`` afterwards does not change what it measures (and the integrity
check reports the replacement).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

_perf_counter_ns = time.perf_counter_ns
_EventBase = torch._C._CudaEventBase if hasattr(torch._C, "_CudaEventBase") else None
_cuda_synchronize = torch.cuda.synchronize
_randint = torch.randint
_Generator = torch.Generator

FINGERPRINT_SAMPLES = 64
#: Bumped whenever a change here changes what a timing means; part of the baseline cache key.
PROTOCOL_VERSION = 3
_AUDIT_SEED_SALT = 0x5BD1E995


class _Marks:
    """Start/end marks on one device: CUDA events, or the CPU's monotonic clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self) -> None:
        if self.cuda:
            _cuda_synchronize(self.device)

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            _EventBase.record(event, torch.cuda.current_stream(self.device))
            return event
        return _perf_counter_ns()

    def elapsed_ms(self, start, end) -> float:
        if self.cuda:
            _EventBase.synchronize(end)
            return float(_EventBase.elapsed_time(start, end))
        return (end - start) / 1e6


def flatten(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def fingerprint(output, fp_seed: int) -> list[dict]:
    """A cheap summary of each output tensor: its size, sampled elements and sum of magnitudes."""
    summary = []
    generator = _Generator().manual_seed(fp_seed)
    for tensor in flatten(output):
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            summary.append({"plain": isinstance(tensor, torch.Tensor) and type(tensor) is torch.Tensor, "numel": 0, "samples": [], "abs_sum": 0.0})
            continue
        flat = tensor.detach().reshape(-1)
        index = _randint(0, flat.numel(), (FINGERPRINT_SAMPLES,), generator=generator).to(flat.device)
        summary.append({
            "plain": type(tensor) is torch.Tensor,  # a subclass could compute lazily, after the end mark
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


def poison(output) -> None:
    """Overwrite returned floating-point outputs with NaN once they have been checked."""
    for tensor in flatten(output):
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            try:
                tensor.detach().fill_(float("nan"))
            except RuntimeError:
                pass


def time_calls(
    fn: Callable, make_inputs: Callable[[int], list], seeds: Sequence[int], device: torch.device, *,
    warmup_seeds: Sequence[int] = (), flush_bytes: int = 256 << 20, fp_seed: int = 0,
    signal: Callable[[str, int], None] | None = None,
    audit: Callable[[list], None] | None = None, audit_at: Sequence[int] = (),
) -> tuple[list[float], list[list[dict]]]:
    """Milliseconds of each timed call, and each call's output fingerprint.

    ``signal("start"|"end", k)`` is called just before the start mark and just after the end
    mark of call k: the evaluation child forwards these to the trusted parent, whose own
    clock then brackets every timed call. ``audit(inputs)`` runs an extra, untimed call on fresh
    inputs after each call whose index is in ``audit_at``, so rule checks reach the timing run
    at positions the code under test cannot predict.
    """
    marks = _Marks(device)
    flush = torch.empty(max(flush_bytes // 4, 1), dtype=torch.float32, device=device)
    with torch.no_grad():
        for seed in warmup_seeds:
            out = fn(*make_inputs(seed))
            marks.sync()
            poison(out)
            del out
        allowance = _tail_allowance(marks, flush)
        times, prints = [], []
        for index, seed in enumerate(seeds):
            inputs = make_inputs(seed)
            # No host synchronisation here: the GPU is still flushing while the call is
            # launched, so launch latency overlaps as it would in a real model (as do_bench).
            flush.zero_()
            if signal:
                signal("start", index)
            start = marks.mark()
            out = fn(*inputs)
            end = marks.mark()
            marks.sync()
            after = marks.mark()
            # Work the call left running on other streams ends before ``after``: charge
            # whatever the device-wide synchronise waited beyond its usual latency.
            hidden = max(0.0, marks.elapsed_ms(end, after) - allowance)
            times.append(marks.elapsed_ms(start, end) + hidden)
            if signal:
                signal("end", index)
            prints.append(fingerprint(out, fp_seed))
            poison(out)
            del out, inputs
            if audit is not None and index in audit_at:
                audit(make_inputs(seed ^ _AUDIT_SEED_SALT))  # inputs of their own: not a repeat of the timed call
                marks.sync()
    return times, prints


def _tail_allowance(marks: _Marks, flush: torch.Tensor, rounds: int = 10) -> float:
    """How long a device-wide synchronise plus a mark take when nothing is pending (ms, 90th percentile)."""
    tails = []
    for _ in range(rounds):
        flush.zero_()
        end = marks.mark()
        marks.sync()
        after = marks.mark()
        tails.append(marks.elapsed_ms(end, after))
    tails.sort()
    return tails[min(len(tails) - 1, int(0.9 * len(tails)))]
