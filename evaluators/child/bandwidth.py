"""The device's memory bandwidth, as a call meets it, and what a call moves: the physical floor's figures
(``evaluators/floor.py``).

Measured in the judge's own process (no candidate code runs there), once per device, by the harness
under the device's lease (a timing step), and cached on the host. The figure is the most any of
these moved, so the floor it gives errs low, never high:

- a copy (bytes read plus bytes written over its time) and a sum (bytes read over its time), of
  float32 tensors from 4 MiB to 1 GiB (the CPU: 64 MiB, past its last-level cache), by fours, each at most an eighth of the
  memory free;
- each after the caches are flushed as before a call (a call's inputs arrive cold), several times;
  the largest over all, so a size whose writes land in a cache (the GPU's L2 absorbs a small
  copy's writes) or whose reads do (a CPU's last-level cache can outlast the flush) counts at that
  speed.
"""

from __future__ import annotations

import os
import time

import torch

#: The sizes tried, in bytes: 4 MiB to 1 GiB by fours (the CPU: to 64 MiB).
_SIZES = [1 << shift for shift in range(22, 31, 2)]
_CPU_LARGEST = 64 << 20
_REPEATS = 5


def best(device: torch.device, flush_bytes: int, threads: int) -> float:
    """Bytes per millisecond: the most a copy or a sum moved on ``device`` (see the module's docstring),
    with ``threads`` intra-op threads on the CPU (the worker's)."""
    flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device=device)
    largest = _free_bytes(device) // 8
    if device.type == "cpu":
        largest = min(largest, _CPU_LARGEST)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        most = 0.0
        for size in [s for s in _SIZES if s <= largest] or _SIZES[:1]:
            source = torch.ones(size // 4, dtype=torch.float32, device=device)
            target = torch.empty_like(source)
            for _ in range(_REPEATS):
                most = max(most, 2 * size / _ms(device, flush, target.copy_, source),
                           size / _ms(device, flush, torch.sum, source))
            del source, target
        return most
    finally:
        torch.set_num_threads(before)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of ``t``'s distinct elements: a dimension it is expanded along (stride 0) counts once
    (what a call moves of an input or an output: ``RefTrialsAnswer.call_bytes``)."""
    count = 1
    for size, stride in zip(t.shape, t.stride()):
        count *= size if stride else min(size, 1)
    return count * t.element_size()


def _ms(device: torch.device, flush: torch.Tensor, work, *args) -> float:
    """Milliseconds of ``work(*args)`` after a flush of the caches: device events on a GPU, the clock on the CPU."""
    flush.bitwise_not_()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work(*args)
        end.record()
        end.synchronize()
        return max(start.elapsed_time(end), 1e-6)
    began = time.perf_counter_ns()
    work(*args)
    return max((time.perf_counter_ns() - began) / 1e6, 1e-6)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
