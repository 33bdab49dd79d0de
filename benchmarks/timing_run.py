"""What one timing run costs the device and the host: the harness's ``time_calls`` in this process.

A timing run has the device to itself (evaluators/sharing.py), so its wall time is device time
every other job on the GPU waits through. This runs the candidate protocol's timing run (30
timed calls on fresh inputs, each behind a cache flush and the launch cover, the fingerprints,
the idle tails) on relu(x + y) with a plain torch callable, without audited calls and with the
default four (each under the device record, ``guards.DeviceRecord``), and reports the wall time
of each against what the device is busy for in it (the kernel, the 256 MB flush and the cover,
measured with events). Separately: what one device record costs on the host, first and warm.

    python benchmarks/timing_run.py [--elements 4194304] [--json timing_run.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from kernel_env.evaluators.child import guards, timing
from kernel_env.evaluators.records import EvalSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 22)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("timing_run.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("timing_run needs a CUDA GPU")
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    s = EvalSettings()

    def make_inputs(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return [torch.randn(args.elements, device=device), torch.randn(args.elements, device=device)]

    def fn(x, y):
        return torch.relu(x + y)

    record = guards.DeviceRecord(device, timing.COVER_KERNEL, timing.END_KERNEL)
    problem = record.probe()
    records_ms = []
    for seed in range(8):
        started = time.perf_counter()
        with record:
            fn(*make_inputs(seed))
            torch.cuda.synchronize()
        records_ms.append((time.perf_counter() - started) * 1e3)

    def audit(inputs, bench: timing.Bench) -> None:
        with record:
            bench.ready(audited=True)
            bench.marks.mark()
            fn(*inputs)
            bench.marks.mark()
            bench.audited_end()
            bench.marks.sync()

    def run(audits: int) -> float:
        positions = list(range(3, s.timed_calls, max(1, s.timed_calls // max(audits, 1))))[:audits]
        started = time.perf_counter()
        timing.time_calls(fn, make_inputs, range(s.timed_calls), device, warmup_seeds=range(s.warmup_calls),
                          flush_bytes=s.flush_bytes, launch_cover_us=s.launch_cover_us, fp_seed=1,
                          signal=lambda kind, k: None, audit=audit, audit_at=positions)
        return time.perf_counter() - started

    run(0)  # compiles the harness's kernels, warms the allocator
    rows = {}
    for audits in (0, s.audited_timed_calls):
        walls = [run(audits) for _ in range(args.repeat)]
        rows[f"{audits} audited calls"] = round(statistics.median(walls) * 1e3, 1)
    # What the device is busy for per timed call: inputs, flush, cover, the call (events around each).
    bench = timing.Bench(device, flush_bytes=s.flush_bytes, launch_cover_us=s.launch_cover_us)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    busy = []
    for seed in range(10):
        torch.cuda.synchronize()
        start.record()
        inputs = make_inputs(seed)
        bench.flush.zero_()
        bench.cover()
        fn(*inputs)
        end.record()
        end.synchronize()
        busy.append(start.elapsed_time(end))
    device_ms = statistics.median(busy) * s.timed_calls
    report = {"device_name": torch.cuda.get_device_name(), "elements": args.elements, "timed_calls": s.timed_calls,
              "record_problem": problem, "record_ms_first": round(records_ms[0], 1),
              "record_ms_warm": round(statistics.median(records_ms[2:]), 1),
              "timing_run_ms": rows, "device_busy_ms_per_run": round(device_ms, 1)}
    print(f"{report['device_name']}, relu(x + y) on {args.elements} elements, {s.timed_calls} timed calls, median of {args.repeat}:")
    print(f"{'timing run':<22}{'wall ms':>9}{'device busy ms':>16}{'busy share':>12}")
    for name, wall in rows.items():
        print(f"{name:<22}{wall:>9}{device_ms:>16.1f}{device_ms / wall:>12.0%}")
    print(f"device record: first {report['record_ms_first']} ms, then {report['record_ms_warm']} ms a call"
          + (f" ({problem})" if problem else ""))
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
