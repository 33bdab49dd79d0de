"""The physical floor on KernelBench: how close honest answers come to it, and none under it.

For each task of a KernelBench checkout (levels 1-3 by default), on one device, as the judge counts
and measures (``evaluators/floor.py``):

- the bytes a call moves: its tensor inputs and the Model's outputs, each by its distinct elements
  (``bandwidth.distinct_bytes``, as the judge's ``RefTrialsAnswer.call_bytes``);
- the device's bandwidth, measured once here as the judge does (``bandwidth.best``);
- the floor (``floor.floor_ms``: none where eager runs under it);
- honest answers' fastest times: the task's Model and, with ``--compile``, torch.compile of it,
  each the minimum of ``triton.testing.do_bench``'s calls (the L2 flushed before each). The minimum,
  not the median: the floor must hold for an honest kernel's luckiest call too.

An honest time under the floor would be an honest kernel refused: the run counts them (it must be
none) and reports how close each answer came (floor / time: 1 is the floor). This process runs the
tasks itself; it counts, it does not guard.

    python benchmarks/physical_floor.py PATH/TO/KernelBench --levels 1,2,3 --compile --json physical_floor_h100.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from pathlib import Path

import torch
from precision_contract import task_model  # (benchmarks/ is the script's folder)

from kernel_env.evaluators import floor
from kernel_env.evaluators.child import bandwidth
from kernel_env.evaluators.records import Timing
from kernel_env.tasks import load_tasks


def _flat(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _fastest_ms(model, inputs: list) -> float:
    import triton.testing

    with torch.no_grad():
        return triton.testing.do_bench(lambda: model(*inputs), return_mode="min")


def measure_task(task, device: torch.device, bytes_per_ms: float, compile_too: bool) -> dict:
    _, model, inputs = task_model(task, device)
    with torch.no_grad():
        outputs = [t for t in _flat(model(*inputs)) if isinstance(t, torch.Tensor)]
    call_bytes = sum(bandwidth.distinct_bytes(t) for t in [*inputs, *outputs] if isinstance(t, torch.Tensor))
    del outputs
    record: dict = {"call_bytes": call_bytes, "eager_min_ms": _fastest_ms(model, inputs)}
    eager = Timing(median_ms=record["eager_min_ms"], min_ms=record["eager_min_ms"], max_ms=record["eager_min_ms"], calls=1)
    record["bytes_floor_ms"] = call_bytes / (bytes_per_ms * floor.SLACK)
    record["floor_ms"] = floor.floor_ms(call_bytes, bytes_per_ms, eager)
    if compile_too:
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*inputs)  # compiles
        record["compile_min_ms"] = _fastest_ms(compiled, inputs)
    for name in ("eager", "compile"):
        fastest = record.get(f"{name}_min_ms")
        if fastest is not None:
            record[f"floor_over_{name}"] = round(record["bytes_floor_ms"] / fastest, 4)
            record[f"{name}_under_floor"] = record["floor_ms"] is not None and fastest < record["floor_ms"]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a KernelBench checkout (or its KernelBench/ folder)")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--compile", action="store_true", help="torch.compile of each Model too (seconds a task)")
    parser.add_argument("--problems", default=None, help="a range of problem numbers per level, e.g. 1-50")
    parser.add_argument("--max-seconds", type=float, default=None, help="start no task after this long (the JSON keeps what ran)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    levels = {int(level) for level in args.levels.split(",")}
    tasks = [t for t in load_tasks(str(args.checkout)) if t.level in levels]
    if args.problems:
        low, high = (int(v) for v in args.problems.split("-"))
        tasks = [t for t in tasks if low <= int(t.id.rsplit("/", 1)[1]) <= high]
    began = time.monotonic()
    bytes_per_ms = bandwidth.best(device, 128 << 20, torch.get_num_threads())  # the judge's flush (EvalSettings)
    header = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "levels": sorted(levels),
              "bandwidth_gb_s": round(bytes_per_ms / 1e6, 1), "slack": floor.SLACK, "compile": args.compile}
    print(f"{len(tasks)} tasks of levels {sorted(levels)} on {header['device']}, torch {torch.__version__}; "
          f"measured bandwidth {header['bandwidth_gb_s']} GB/s (measured in {time.monotonic() - began:.1f} s)", flush=True)
    records = []
    for number, task in enumerate(tasks, 1):
        if args.max_seconds and time.monotonic() - began > args.max_seconds:
            print(f"stopping after {number - 1} tasks: --max-seconds {args.max_seconds:.0f} reached")
            break
        started = time.monotonic()
        try:
            record = measure_task(task, device, bytes_per_ms, args.compile)
        except Exception as exc:  # noqa: BLE001 - counted and shown, as a task we could not run here
            record = {"error": f"{type(exc).__name__}: {str(exc).strip()[:160]}",
                      "where": traceback.format_exc().strip().splitlines()[-1][:200]}
        record |= {"id": task.id, "name": task.name, "level": task.level, "seconds": round(time.monotonic() - started, 2)}
        records.append(record)
        if "error" in record:
            line = record["error"]
        else:
            line = (f"{record['call_bytes'] / 1e6:9.1f} MB  floor {record['bytes_floor_ms']:.4f} ms"
                    f"{'' if record['floor_ms'] is not None else ' (none: eager under it)'}  eager {record['eager_min_ms']:.4f}"
                    + (f"  compile {record['compile_min_ms']:.4f}" if "compile_min_ms" in record else "")
                    + ("   <-- HONEST UNDER THE FLOOR" if record.get("eager_under_floor") or record.get("compile_under_floor") else ""))
        print(f"  [{number}/{len(tasks)}] {task.id} {task.name[:36]:36} {line} ({record['seconds']} s)", flush=True)
        torch.cuda.empty_cache()
        if args.json:  # after every task: a run cut short keeps what it measured
            _write(args.json, header, records)
    summary = summarize(records)
    if args.json:
        _write(args.json, header, records, summary=summary)
        print(f"wrote {args.json}")


def summarize(records: list) -> dict:
    """Per level and answer: tasks measured, with a floor, under it (must be none), and the closest any came."""
    ran = [r for r in records if "error" not in r]
    summary: dict = {"errors": [r["id"] for r in records if "error" in r]}
    print(f"\n{'level':>5} {'answer':8} {'measured':>9} {'with a floor':>13} {'under it':>9} {'closest (floor/time)':>21} "
          f"{'median':>7}")
    for level in sorted({r["level"] for r in ran}):
        for name in ("eager", "compile"):
            entries = [r for r in ran if r["level"] == level and f"{name}_min_ms" in r]
            if not entries:
                continue
            floored = [r for r in entries if r["floor_ms"] is not None]
            under = [r["id"] for r in floored if r[f"{name}_under_floor"]]
            ratios = [r[f"floor_over_{name}"] for r in floored]
            closest = max(floored, key=lambda r: r[f"floor_over_{name}"], default=None)
            summary[f"L{level} {name}"] = {"measured": len(entries), "with_floor": len(floored), "under": under,
                                           "closest": closest and (closest["id"], closest[f"floor_over_{name}"]),
                                           "median_ratio": round(statistics.median(ratios), 4) if ratios else None}
            print(f"{level:>5} {name:8} {len(entries):>9} {len(floored):>13} {len(under):>9} "
                  f"{(closest['id'] + ' ' + format(closest[f'floor_over_{name}'], '.3f')) if closest else '-':>21} "
                  f"{summary[f'L{level} {name}']['median_ratio'] or '-':>7}")
    print(f"\nerrors: {len(summary['errors'])}{': ' + ', '.join(summary['errors']) if summary['errors'] else ''}")
    return summary


def _write(path: Path, header: dict, records: list, **summed) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**header, **summed, "tasks": records}, indent=1, default=str))


if __name__ == "__main__":
    main()
