"""The precision contract's threshold on KernelBench: no honest answer refused, the downgrades caught.

For each task of a KernelBench checkout (levels 1-2 by default), on one device, as the judge measures a
call (``evaluators/child/precision.py``, ``Contract.measure``), on the task's own inputs:

- honest answers, which must never be refused: the task's Model itself (what issue 45 asks: its own
  Models as candidates), and where ``--alternatives`` is given, the Model with cuDNN's autotuner on
  (other convolution algorithms, float32) and on the CPU (other libraries, other summation orders);
- downgrades, which the contract refuses wherever the task's answer shows its precision: the Model
  with TF32 allowed in matmuls and convolutions, and under ``torch.autocast`` to bfloat16. A
  downgrade outside the 1e-2 tolerance is refused by the tolerance already (counted apart).

It runs the contract here in this process (the evaluation runs it in the judge's isolated process;
this counts, it does not guard):

    python benchmarks/precision_contract.py PATH/TO/KernelBench --levels 1,2 --json precision_contract_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
import traceback
from pathlib import Path

import torch

from kernel_env.evaluators.child import precision
from kernel_env.evaluators.child.compare import compare_outputs
from kernel_env.tasks import load_tasks

HONEST = ("model", "cudnn_autotuned", "cpu")
DOWNGRADES = ("tf32", "autocast_bf16")
#: The CPU alternative runs tasks whose inputs take this much at most (a level-1 task's take gigabytes).
_CPU_BYTES = 256 << 20


@contextlib.contextmanager
def _tf32(on: bool):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def _autotuned():
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def _flat(out) -> list:
    return [t.detach() if isinstance(t, torch.Tensor) else t for t in (out if isinstance(out, (list, tuple)) else [out])]


def _answer(name: str, model, inputs: list, device: torch.device) -> list:
    """The outputs of one way of computing the task (``HONEST``, ``DOWNGRADES``), on ``device``."""
    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        if name == "model":
            return _flat(model(*copies))
        if name == "cudnn_autotuned":
            with _autotuned():
                return _flat(model(*copies))
        if name == "cpu":
            if sum(x.nbytes for x in inputs if isinstance(x, torch.Tensor)) > _CPU_BYTES:
                raise ValueError(f"inputs over {_CPU_BYTES >> 20} MiB: too large to run on the CPU here")
            import copy as copying
            cpu = copying.deepcopy(model).cpu()
            return [t.to(device) if isinstance(t, torch.Tensor) else t
                    for t in _flat(cpu(*[x.cpu() if isinstance(x, torch.Tensor) else x for x in copies]))]
        if name == "tf32":
            with _tf32(True):
                return _flat(model(*copies))
        if name == "autocast_bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return _flat(model(*copies))
    raise ValueError(name)


def task_model(task, device: torch.device) -> tuple[dict, torch.nn.Module, list]:
    """(the task's namespace, its Model on ``device`` under seed 0, its inputs under seed 1 made there)."""
    namespace: dict = {"__name__": "kernelbench_task"}
    exec(compile(task.code, "model.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]()).to(device).eval()
    torch.manual_seed(1)
    with torch.device(device):
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
    return namespace, model, inputs


def measure_task(task, device: torch.device, answers: tuple[str, ...], atol: float, rtol: float) -> dict:
    namespace, model, inputs = task_model(task, device)
    with _tf32(False), torch.no_grad():  # eager's own flags (matmul: no TF32; convolutions: cuDNN's default)
        torch.backends.cudnn.allow_tf32 = True
        eager = _flat(model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]))
    contract = precision.Contract(model, namespace)
    record: dict = {}
    for name in answers:
        started = time.monotonic()
        try:
            with _tf32(False):
                torch.backends.cudnn.allow_tf32 = True
                got = _answer(name, model, inputs, device)
            # (autocast's outputs in the task's dtypes: a kernel computing in bfloat16 returns what the task returns)
            got = [g.to(e.dtype) if isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor) and g.is_floating_point()
                   else g for g, e in zip(got, eager)]
        except Exception as exc:  # noqa: BLE001 - a way the task cannot be computed (autocast of an op, ...)
            record[name] = {"skipped": f"{type(exc).__name__}: {str(exc)[:100]}"}
            continue
        tolerance = compare_outputs(0, eager if len(eager) > 1 else eager[0], got if len(got) > 1 else got[0], atol, rtol)
        entry = {"within_tolerance": tolerance.correct}
        if tolerance.correct:
            found = contract.measure(inputs, eager, got)
            entry |= {"refused": found.refused, "error": found.error, "eager_error": found.eager_error,
                      "limit": found.limit, "note": found.note, "output": found.output,
                      "dtype": str(eager[found.output].dtype).removeprefix("torch.")}
        entry["seconds"] = round(time.monotonic() - started, 2)
        record[name] = entry
        del got
    record["downgrade_errors"] = contract._downgrade_errors
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, nargs="?", help="a KernelBench checkout (or its KernelBench/ folder)")
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--alternatives", action="store_true", help="the honest alternatives too (cuDNN autotuned, the CPU)")
    parser.add_argument("--atol", type=float, default=1e-2)
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--problems", default=None, help="a range of problem numbers per level, e.g. 1-50")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--recompute", type=Path, default=None,
                        help="a run's JSON: its decisions again under the rule as it stands, written to --json")
    args = parser.parse_args()
    if args.recompute:
        recompute(args.recompute, args.json or args.recompute)
        return
    device = torch.device(args.device)
    levels = {int(level) for level in args.levels.split(",")}
    tasks = [t for t in load_tasks(str(args.checkout)) if t.level in levels]
    if args.problems:
        low, high = (int(v) for v in args.problems.split("-"))
        tasks = [t for t in tasks if low <= int(t.id.rsplit("/", 1)[1]) <= high]
    answers = (HONEST if args.alternatives else HONEST[:1]) + DOWNGRADES
    print(f"{len(tasks)} tasks of levels {sorted(levels)} on {device} "
          f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'}), "
          f"torch {torch.__version__}; answers: {', '.join(answers)}", flush=True)
    records, began = [], time.monotonic()
    for number, task in enumerate(tasks, 1):
        started = time.monotonic()
        try:
            record = measure_task(task, device, answers, args.atol, args.rtol)
        except Exception as exc:  # noqa: BLE001 - counted and shown, as a task we could not run here
            record = {"error": f"{type(exc).__name__}: {str(exc).strip()[:160]}",
                      "where": traceback.format_exc().strip().splitlines()[-1][:200]}
        record |= {"id": task.id, "name": task.name, "level": task.level, "seconds": round(time.monotonic() - started, 2)}
        records.append(record)
        refused = [a for a in HONEST if record.get(a, {}).get("refused")]
        line = "; ".join(f"{a}: {'REFUSED' if e.get('refused') else 'tol' if not e.get('within_tolerance', True) else 'ok'}"
                         for a in answers if isinstance(e := record.get(a), dict) and "skipped" not in e)
        print(f"  [{number}/{len(tasks)}] {task.id} {task.name[:40]}: {record.get('error') or line}"
              f"{'   <-- HONEST REFUSED' if refused else ''} ({record['seconds']} s)", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.json:  # after every task: a run cut short keeps what it measured
            _write(args.json, device, levels, answers, records)
    summary, honest_refused = summarize(records, answers)
    print(f"\n{len(records) - sum('error' in r for r in records)} of {len(records)} tasks measured in "
          f"{time.monotonic() - began:.0f} s")
    if args.json:
        _write(args.json, device, levels, answers, records, summary=summary, honest_refused=honest_refused)
        print(f"wrote {args.json}")


def summarize(records: list, answers: tuple) -> tuple[dict, list]:
    """Per answer: tasks measured, outside the tolerance, refused, passed; and the honest answers refused."""
    ran = [r for r in records if "error" not in r]
    print(f"\n{'answer':16} {'measured':>9} {'outside tolerance':>18} {'refused':>8} {'passed':>7}")
    summary = {}
    for name in answers:
        entries = [r[name] for r in ran if name in r and "skipped" not in r[name]]
        outside = sum(not e["within_tolerance"] for e in entries)
        refused = sum(bool(e.get("refused")) for e in entries)
        passed = len(entries) - outside - refused
        summary[name] = {"measured": len(entries), "outside_tolerance": outside, "refused": refused, "passed": passed}
        print(f"{name:16} {len(entries):>9} {outside:>18} {refused:>8} {passed:>7}")
    honest_refused = [f"{r['id']} ({a})" for r in ran for a in HONEST if r.get(a, {}).get("refused")]
    print(f"\nhonest answers refused: {len(honest_refused)}{': ' + ', '.join(honest_refused) if honest_refused else ''}")
    return summary, honest_refused


def recompute(path: Path, out: Path) -> None:
    """A run's decisions again under the rule as it stands (``precision.refusal_limit``), from the errors it
    measured: eager's, the downgrade's and each answer's do not depend on the rule."""
    data = json.loads(path.read_text())
    for record in data["tasks"]:
        lows = record.get("downgrade_errors") or {}
        lows = lows.get("as_is") if isinstance(lows, dict) else lows
        for name in data["answers"]:
            entry = record.get(name)
            if not isinstance(entry, dict) or entry.get("error") is None:
                continue
            index = entry.get("output", 0)
            low = lows[index] if lows and index < len(lows) else None
            dtype = getattr(torch, entry.get("dtype", "float32"))
            if low is None:
                continue
            entry["limit"] = precision.refusal_limit(entry["eager_error"], low, dtype)
            entry["refused"] = entry["error"] > entry["limit"]
    data["summary"], data["honest_refused"] = summarize(data["tasks"], tuple(data["answers"]))
    data["recomputed_from"] = str(path)
    out.write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {out}")


def _write(path: Path, device: torch.device, levels: set, answers: tuple, records: list, **summed) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "levels": sorted(levels), "answers": list(answers), **summed, "tasks": records}, indent=1, default=str))


if __name__ == "__main__":
    main()
