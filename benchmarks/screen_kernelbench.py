"""How many KernelBench tasks a trivial answer passes, before and after the trial-input variants.

For each task of a KernelBench checkout (levels 1-3 by default), the Model runs the evaluation's
five correctness trials twice on one device: once with every trial on the task's own inputs (the
trials before issue 26), once with the trials' input variants (``evaluators/child/screen.py``,
as every evaluation now draws them, falling back to the task's own inputs where a variant leaves
its domain). ``screen.TrivialAnswers`` says, at the evaluator's tolerance, which trivial answers
would pass every trial: zeros, a constant, the first trial's output replayed, an input passed
through. A task "passes" an answer when that answer passes each of its outputs. After the
variants, a task some trivial answer passes is refused by every evaluation (and by
``kernel-env tasks --check``), with its reason.

The screen runs here in this process, on ``--device`` (the evaluation runs it in the
reference's isolated process; this counts, it does not guard):

    python benchmarks/screen_kernelbench.py PATH/TO/KernelBench --device cuda --json screen_kernelbench.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import time
import traceback
from pathlib import Path

import torch

from kernel_env.evaluators.child import screen
from kernel_env.tasks import load_tasks

TRIALS = 5
KINDS = ("zeros", "a constant", "the first trial's output", "an input")


def make_inputs(namespace: dict, device: torch.device, seed: int, variant: str) -> list:
    """``runner.Runner.make_inputs``: the task's inputs for a seed, on the device, reshaped by the variant."""
    torch.manual_seed(seed)
    with torch.device(device):
        made = namespace["get_inputs"]()
    return screen.vary([x.to(device) if isinstance(x, torch.Tensor) else x for x in made], variant, seed)


def run(model, inputs: list, variant: str) -> list | None:
    """The Model on copies of ``inputs``; None where a variant's inputs make it raise (the task's own may not)."""
    try:
        with torch.no_grad():
            out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    except Exception:
        if variant == "as_is":
            raise
        return None
    return [t.detach() for t in (out if isinstance(out, (list, tuple)) else [out])]


def trials(namespace: dict, model, device: torch.device, variants: list[str], atol: float, rtol: float) -> screen.TrivialAnswers:
    """The evaluation's trials (``runner.Runner.run_trials`` for the reference), screened."""
    answers = screen.TrivialAnswers(atol, rtol)
    for index, variant in enumerate(variants):
        seed = 1000 + index
        outputs = inputs = None  # the last trial's, freed before the next is made
        inputs = make_inputs(namespace, device, seed, variant)
        outputs = run(model, inputs, variant)
        if variant != "as_is" and (outputs is None or not screen.finite(outputs)):
            inputs = outputs = None
            inputs = make_inputs(namespace, device, seed, "as_is")
            outputs = run(model, inputs, "as_is")
        answers.add(outputs, inputs)
    return answers


def passed_kinds(answers: screen.TrivialAnswers) -> set[str]:
    """The trivial answers (``KINDS``) that pass every output of the task."""
    per_output = [{"an input" if name.startswith("input") else name for name in names} for names in answers.passing()]
    return set.intersection(*per_output) if per_output else set()


def screen_task(task, device: torch.device, atol: float, rtol: float) -> dict:
    namespace: dict = {"__name__": "kernelbench_task"}
    exec(compile(task.code, "model.py", "exec"), namespace)
    torch.manual_seed(0)
    with torch.device(device):
        model = namespace["Model"](*namespace["get_init_inputs"]())
    model = model.to(device).eval()
    record = {}
    for when, variants in (("before", ["as_is"] * TRIALS),
                           ("after", screen.trial_variants(TRIALS, screen.task_variants(namespace)))):
        answers = trials(namespace, model, device, variants, atol, rtol)
        record[when], record["refused_before" if when == "before" else "refused"] = sorted(passed_kinds(answers)), answers.reasons()
        del answers  # its first trial's outputs: the second pass needs the memory
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a KernelBench checkout (or its KernelBench/ folder)")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--atol", type=float, default=1e-2)
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--count", type=int, default=None, help="the first N tasks of each level (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    levels = {int(level) for level in args.levels.split(",")}
    tasks = [t for t in load_tasks(str(args.checkout)) if t.level in levels]
    if args.count is not None:
        tasks = [t for level in sorted(levels) for t in [t for t in tasks if t.level == level][:args.count]]
    print(f"{len(tasks)} tasks of levels {sorted(levels)} on {device} "
          f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'})", flush=True)
    records = []
    began = time.monotonic()
    for number, task in enumerate(tasks, 1):
        started = time.monotonic()
        try:
            record = screen_task(task, device, args.atol, args.rtol)
        except Exception as exc:  # noqa: BLE001 - counted and shown, as a task we could not run here
            record = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200],
                      "where": traceback.format_exc().strip().splitlines()[-1][:200]}
        record |= {"id": task.id, "name": task.name, "level": task.level, "seconds": round(time.monotonic() - started, 2)}
        records.append(record)
        if record.get("refused") or record.get("refused_before") or record.get("error"):
            print(f"  [{number}/{len(tasks)}] {task.id} {task.name}: "
                  f"{record.get('error') or '; '.join(record['refused']) or 'refused only before: ' + '; '.join(record['refused_before'])}",
                  flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ran = [r for r in records if "error" not in r]
    print(f"\n{len(ran)} of {len(records)} tasks screened in {time.monotonic() - began:.0f} s "
          f"({len(records) - len(ran)} could not run here)\n")
    print(f"{'trivial answer':28} {'tasks it passes before':>24} {'after':>7}")
    for kind in KINDS:
        print(f"{kind:28} {sum(kind in r['before'] for r in ran):>24} {sum(kind in r['after'] for r in ran):>7}")
    refused_before = [r for r in ran if r["refused_before"]]
    refused = [r for r in ran if r["refused"]]
    print(f"{'any of them (refused)':28} {len(refused_before):>24} {len(refused):>7}")
    reasons = collections.Counter(reason.split(" as ")[0].split(" (")[0] for r in refused for reason in r["refused"][:1])
    print("\nrefused after the variants, by first reason:")
    for reason, count in reasons.most_common():
        print(f"  {count:3}  {reason}")
    for r in refused:
        print(f"  {r['id']} {r['name']}: {'; '.join(r['refused'])}")
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "torch": torch.__version__, "levels": sorted(levels),
                                         "atol": args.atol, "rtol": args.rtol, "tasks": records}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
