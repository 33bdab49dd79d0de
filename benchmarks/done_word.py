"""The judge/worker round trip on a GPU, bare: how the worker's "done" word is written decides its modes.

Two processes play one call of kernel_env's protocol (docs/design.md, One call, and the clock) with
nothing else around it. The worker queues [wait until the call word holds k] [its work] [done = k];
the judge queues [host gate] e0 [its own work] [call word = k] [wait until done == k] [its own
work] e1 and opens the gate; the time is e1 - e0, 200 calls per condition, each condition with a
fresh worker process. The conditions differ in one thing at a time:

- how the done word is written: a stream memory operation (``cuStreamWriteValue32``, what
  the worker does) or a one-element copy kernel (``echo``: what it did before 2026-11-29, copying a
  nonce the judge wrote);
- the worker's work: a one-element add, a ``torch.cuda._sleep`` of ~20 us, or relu(x + y) on 4M or
  16M float32 elements read from the judge's shared buffers (``real``: the judge copies the inputs
  in before the call word and its own copy of the output out after the done word, as a call does);
- the judge's own work: the 128 MB L2 flush before the call word and after the done word;
- idle CUDA contexts of other processes on the device, and the worker's host sleeping 2 ms before
  it synchronises;
- stalled CUDA contexts of other processes: each with a call queued behind a wait for a word that is
  not written until the condition ends (what a worker frozen between its ``Done`` and its judge's
  ``Go`` leaves on the device).

Prints, per condition, the minimum, the deciles and a histogram of the calls in microseconds above
the minimum; writes every call's time to JSON. (Reading it: a kernel's write of the done word
splits the calls with real work in two modes ~7 us apart, in shares that differ from run to run; a
stream memory operation's leaves one.)

    python benchmarks/done_word.py [--calls 200] [--conditions plain echo real4M real4M_echo ...] [--json done_word.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

#: name -> the condition's settings (``run``'s keywords).
CONDITIONS = {
    "plain": {},
    "idle3": {"idles": 3},
    "idle8": {"idles": 8},
    "stalled1": {"idles": 1, "stalled": True},
    "stalled3": {"idles": 3, "stalled": True},
    "real4M_flush_stalled1": {"real": 1 << 22, "judge_work": 128 << 20, "idles": 1, "stalled": True},
    "sleep_after": {"idle_after": 0.002},
    "work20us": {"work_cycles": 40000},
    "flush128M": {"judge_work": 128 << 20},
    "echo": {"echo": True},
    "real4M": {"real": 1 << 22},
    "real4M_echo": {"real": 1 << 22, "echo": True},
    "real4M_flush": {"real": 1 << 22, "judge_work": 128 << 20},
    "real4M_flush_echo": {"real": 1 << 22, "judge_work": 128 << 20, "echo": True},
    "real16M_flush_echo": {"real": 1 << 24, "judge_work": 128 << 20, "echo": True},
}
SEQ, DONE = 0, 4  # the two words' offsets in the flags page, as exchange.Flags lays them out


def worker(conn, flags_handle: str, work_cycles: int, idle_after: float, real: int, echo: bool, inputs_handle: str | None):
    import torch

    from kernel_env.evaluators.child.exchange import DeviceMemory
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    memory = DeviceMemory(device)
    base, _ = memory.open(flags_handle)
    words = memory.bytes_at(base, 12).view(torch.int32)
    x = torch.zeros(1 << 20, device=device)
    # Every kernel queued behind the call word is launched once first: a first launch loads its
    # module, which waits for the work queued before it, the wait for the call word among it.
    x.add_(1)
    torch.cuda._sleep(100)
    if real:
        pointer, _ = memory.open(inputs_handle)
        inputs = memory.bytes_at(pointer, 8 * real).view(torch.float32)
        a, b = inputs[:real], inputs[real:]
        out = torch.empty(real, device=device)
        torch.add(a, b, out=out).relu_()
        allocation, _ = memory.extent(out.data_ptr())
        conn.send(memory.export(allocation))
        conn.send(out.data_ptr() - allocation)
    words[2:3].copy_(words[1:2])
    torch.cuda.synchronize()
    conn.send("ready")
    stream = torch.cuda.default_stream(device)
    while (k := conn.recv()) is not None:
        memory.wait_value(stream, base + SEQ, k)
        if real:
            torch.add(a, b, out=out).relu_()
        elif work_cycles:
            torch.cuda._sleep(work_cycles)
        else:
            x.add_(1)
        if echo:
            words[1:2].copy_(words[0:1])  # done = k, by a kernel
        else:
            memory.write_value(stream, base + DONE, k)
        conn.send(k)
        if idle_after:
            time.sleep(idle_after)
        torch.cuda.synchronize()
        conn.send("settled")


def idle(conn, stalled: bool):
    import torch

    from kernel_env.evaluators.child.exchange import DeviceMemory
    x = torch.zeros(1 << 22, device="cuda:0")
    x.add_(1)
    torch.cuda.synchronize()
    word = torch.zeros(1, dtype=torch.int32).pin_memory()
    if stalled:  # a call queued behind its call word, as a worker frozen before its Go leaves it
        DeviceMemory(x.device).wait_value(torch.cuda.current_stream(), DeviceMemory(x.device).host_pointer(word), 1)
        x.add_(1)
    conn.send("ready")
    conn.recv()
    word[0] = 1
    torch.cuda.synchronize()


def run(calls: int, work_cycles: int = 0, idles: int = 0, idle_after: float = 0.0, judge_work: int = 0, real: int = 0,
        echo: bool = False, stalled: bool = False) -> list[float]:
    """``calls`` calls' times (us) under one condition, with a worker process of its own."""
    import torch

    from kernel_env.evaluators.child.exchange import DeviceMemory
    device = torch.device("cuda:0")
    memory = DeviceMemory(device)
    spawn = mp.get_context("spawn")
    others = []
    for _ in range(idles):
        ours, theirs = spawn.Pipe()
        process = spawn.Process(target=idle, args=(theirs, stalled))
        process.start()
        ours.recv()
        others.append((ours, process))
    base = memory.alloc(4096)
    gate = torch.zeros(1, dtype=torch.int32).pin_memory()
    gate_address = memory.host_pointer(gate)
    inputs_handle = None
    if real:
        pointer = memory.alloc(8 * real)
        inputs_handle = memory.export(pointer)
        shared_inputs = memory.bytes_at(pointer, 8 * real).view(torch.float32)
        source = torch.randn(2 * real, device=device)
    conn, theirs = spawn.Pipe()
    process = spawn.Process(target=worker, args=(theirs, memory.export(base), work_cycles, idle_after, real, echo, inputs_handle))
    process.start()
    if real:
        handle, offset = conn.recv(), conn.recv()
        pointer, size = memory.open(handle)
        outputs = memory.bytes_at(pointer, size)[offset:offset + 4 * real].view(torch.float32)
        mine = torch.empty(real, device=device)
        mine.copy_(outputs)
        shared_inputs.copy_(source)
    conn.recv()
    stream = torch.cuda.current_stream(device)
    flush = torch.zeros(judge_work, dtype=torch.uint8, device=device) if judge_work else None
    if flush is not None:
        flush.bitwise_not_()
    torch.cuda.synchronize()
    times = []
    for k in range(1, calls + 1):
        conn.send(k)
        conn.recv()  # the worker's call is queued
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        memory.wait_value(stream, gate_address, k)
        start.record(stream)
        if real:
            shared_inputs.copy_(source)
        if flush is not None:
            flush.bitwise_not_()
        memory.write_value(stream, base + SEQ, k)
        memory.wait_value(stream, base + DONE, k)
        if flush is not None:
            flush.bitwise_not_()
        if real:
            mine.copy_(outputs)
        end.record(stream)
        gate[0] = k
        conn.recv()  # settled
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    conn.send(None)
    process.join()
    for other, idler in others:
        other.send(None)
        idler.join()
    memory.free(base)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--conditions", nargs="+", choices=list(CONDITIONS), default=list(CONDITIONS))
    parser.add_argument("--json", type=Path, default=Path("done_word.json"))
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("done_word needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda:0")
    found = {}
    print(f"{'condition':20} {'min us':>8}  deciles (us)  |  calls by us above the minimum")
    for name in args.conditions:
        times = run(args.calls, **CONDITIONS[name])
        low = min(times)
        histogram: dict[int, int] = {}
        for t in times:
            histogram[int(t - low)] = histogram.get(int(t - low), 0) + 1
        deciles = " ".join(f"{d:.1f}" for d in statistics.quantiles(times, n=10))
        print(f"{name:20} {low:8.1f}  {deciles}  |  {dict(sorted(histogram.items()))}", flush=True)
        found[name] = times
    args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": found}))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
