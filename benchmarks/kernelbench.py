"""KernelBench end to end: every problem through a full evaluation, and the baselines held against
KernelBench's own published H100 times.

Each problem of a KernelBench checkout runs as the final evaluation of an episode would
(``Mode.FINAL`` through a ``LocalPool``: the screen, five trials, the eager and torch.compile
baselines measured by the harness and cached as ``kernel-env baseline`` caches them, then the
candidate's timing run), with the task's own ``Model`` renamed ``ModelNew`` as the candidate. That
candidate computes with torch, so the one rule it breaks, torch computing inside ``forward``, is off
(``EvalSettings.own_kernels_only=False``); every other rule and check holds. So:

- every problem that passes the screen must come out correct with reward 1: the candidate is the
  eager baseline's own code, so a 2 or 3 is the harness paying a speed-up that is not there, and a
  -1 a task the harness cannot judge honestly;
- the candidate's time over the eager baseline's is the timing path's fidelity on real problems
  (the same code, timed twice, by two paths);
- eager and compile over KernelBench's published times (``results/timing/H100_Modal`` and
  ``H100_PCIe_LambdaLabs``, torch 2.5.0 + CUDA 12.4, the mean of 100 calls) say where our clock
  and theirs part.

Levels run one after another, all of a level's problems queued at once (``--jobs-per-gpu`` at a
time on the device), so each level's wall time is what evaluating it costs. Prints a table per level
and writes every problem's record (``--json``):

    python benchmarks/kernelbench.py PATH/TO/KernelBench --device cuda --levels 1,2,3 --json kernelbench.json

PATH is a KernelBench checkout (the folder holding ``KernelBench/level1`` and ``results/timing``).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import as_completed
from pathlib import Path

import torch

from kernel_env import config
from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode
from kernel_env.runtime.pool import LocalPool
from kernel_env.tasks import Task, TaskError
from kernel_env.tasks.loaders import load_kernelbench

PUBLISHED = {"modal": "H100_Modal", "lambda": "H100_PCIe_LambdaLabs"}
KINDS = {"eager": "baseline_time_torch.json", "compile": "baseline_time_torch_compile_inductor_default.json"}
SETTINGS = EvalSettings(own_kernels_only=False)


def own_model_as_candidate(task: Task, folder: Path) -> Path:
    """A snapshot whose model_new.py is the task itself with ``Model`` renamed ``ModelNew``."""
    folder.mkdir(parents=True)
    (folder / "model_new.py").write_text(re.sub(r"\bModel\b", "ModelNew", task.code))
    return folder


def published_times(checkout: Path) -> dict[str, dict[tuple[int, str], float]]:
    """KernelBench's published mean times (ms) by source and kind ("modal eager", ...), keyed by (level, file name)."""
    found = {}
    for source, folder in PUBLISHED.items():
        for kind, name in KINDS.items():
            path = checkout / "results" / "timing" / folder / name
            if path.is_file():
                data = json.loads(path.read_text())
                found[f"{source} {kind}"] = {(int(level.removeprefix("level")), file): entry["mean"]
                                             for level, problems in data.items() for file, entry in problems.items()}
    return found


def record(task: Task, result: EvalResult, published: dict) -> dict:
    """What one problem's evaluation says, with the published times beside ours."""
    file = f"{task.problem_id}_{task.name}.py"
    ours = {"eager": result.eager_ms, "compile": result.compile_ms}
    row = {"id": task.id, "level": task.level, "file": file, "correct": result.correct, "reward": result.reward,
           "fault": result.fault, "error": result.error, "violations": result.violations,
           "candidate_ms": result.runtime_ms, "eager_ms": ours["eager"], "compile_ms": ours["compile"],
           "candidate_sem_ms": result.runtime.sem_ms if result.runtime else None,
           "eager_sem_ms": result.eager.sem_ms if result.eager else None,
           "close_calls": result.close_calls, "seconds": round(result.duration_s, 2),
           "steps_s": {name: round(s, 3) for name, s in result.steps_s.items()}}
    row["candidate_over_eager"] = _ratio(result.runtime_ms, ours["eager"])
    for key, times in published.items():
        source, kind = key.split()
        theirs = times.get((task.level, file))
        row[f"{source}_{kind}_ms"] = theirs
        row[f"{kind}_over_{source}"] = _ratio(ours[kind], theirs)
    return row


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 4) if ours and theirs else None


def quantiles(values: list[float]) -> str:
    """p10 / median / p90 of the values (— when none)."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return f"{deciles[0]:.2f} / {statistics.median(values):.2f} / {deciles[-1]:.2f}"


def _refused(row: dict) -> bool:
    """Refused by the screen (a trivial answer passes the task, or its reference is not finite)."""
    return (row["error"] or "").startswith("the task cannot be evaluated")


def summary(level: int, rows: list[dict], wall_s: float) -> dict:
    """A level's counts and ratio distributions (p10 / median / p90)."""
    screened = [r for r in rows if not _refused(r)]
    rewards = {str(k): sum(1 for r in rows if r["reward"] == k) for k in (-1, 1, 2, 3)}
    within = lambda key, limit: sum(1 for r in rows if r[key] is not None and abs(r[key] - 1) <= limit)
    return {"level": level, "problems": len(rows), "refused_by_screen": len(rows) - len(screened),
            "evaluator_faults": sum(1 for r in screened if r["fault"] == "evaluator"),
            "correct": sum(1 for r in rows if r["correct"]), "rewards": rewards, "wall_s": round(wall_s, 1),
            "candidate_over_eager": quantiles([r["candidate_over_eager"] for r in rows]),
            "candidate_within_5pct_of_eager": within("candidate_over_eager", 0.05),
            **{f"{kind}_over_{source}": quantiles([r.get(f"{kind}_over_{source}") for r in rows])
               for source in PUBLISHED for kind in KINDS},
            **{f"{kind}_over_{source}_within_10pct": within(f"{kind}_over_{source}", 0.10)
               for source in PUBLISHED for kind in KINDS}}


def print_summaries(summaries: list[dict]) -> None:
    columns = [("level", "level"), ("problems", "problems"), ("refused_by_screen", "refused"),
               ("evaluator_faults", "faults"), ("correct", "correct"), ("rewards", "rewards -1/1/2/3"),
               ("wall_s", "wall s"), ("candidate_over_eager", "cand/eager p10/med/p90"),
               ("eager_over_modal", "eager/published p10/med/p90"), ("compile_over_modal", "compile/published p10/med/p90")]
    print("\n" + " | ".join(title for _, title in columns))
    for s in summaries:
        cells = ["/".join(str(v) for v in s[key].values()) if key == "rewards" else str(s[key]) for key, _ in columns]
        print(" | ".join(cells))


def _levels(text: str) -> list[int]:
    try:
        return [int(level) for level in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are numbers, comma-separated (1,2,3)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a KernelBench checkout (KernelBench/level1/..., results/timing/...)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (the problems are sized for an H100: on the CPU a level-1 or -2 problem takes "
                             "minutes and more memory than a small machine has)")
    parser.add_argument("--levels", type=_levels, default=[1, 2, 3])
    parser.add_argument("--count", type=int, default=None, help="the first N problems of each level (default: all)")
    parser.add_argument("--only", default=None, help="comma-separated task ids (kernelbench/L1/12,...)")
    parser.add_argument("--jobs-per-gpu", type=int, default=config.jobs_per_gpu())
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--resume", action="store_true", help="keep the problems --json already holds and run the rest "
                                                              "(a level's wall time adds up over the runs)")
    args = parser.parse_args()
    if args.resume and not args.json:
        parser.error("--resume reads and extends the --json file: name one")

    levels = args.levels
    try:
        tasks = load_kernelbench(args.checkout, levels)
    except TaskError as exc:
        parser.error(str(exc))
    if absent := [level for level in levels if not any(t.level == level for t in tasks)]:
        parser.error(f"{args.checkout} has no problems of level {', '.join(map(str, absent))}")
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t.id in wanted]
    if args.count is not None:
        tasks = [t for level in levels for t in [t for t in tasks if t.level == level][:args.count]]
    published = published_times(args.checkout)
    gpu = args.device.startswith("cuda")
    name = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    slots = f"{args.jobs_per_gpu} jobs per GPU" if gpu else f"{config.jobs_per_cpu()} jobs at once on the CPU"
    print(f"{len(tasks)} problems of levels {levels} on {name}, torch {torch.__version__}, {slots}; "
          f"published times: {', '.join(published) or 'none found'}", flush=True)

    def save(rows: list[dict], summaries: list[dict]) -> None:
        """The JSON so far (after every problem: a run cut short keeps what it measured)."""
        if args.json:
            args.json.write_text(json.dumps({"device": name, "torch": torch.__version__,
                                             "cuda": torch.version.cuda, "python": sys.version.split()[0],
                                             "jobs_per_gpu": args.jobs_per_gpu, "settings": SETTINGS.model_dump(),
                                             "levels": summaries, "problems": rows}, indent=1))

    rows, walls = [], {}
    if args.resume and args.json.is_file():
        earlier = json.loads(args.json.read_text())
        rows, walls = earlier["problems"], {s["level"]: s["wall_s"] for s in earlier["levels"]}
        print(f"resuming: {len(rows)} problems measured before", flush=True)
    # A problem the evaluator failed says nothing of the problem: it runs again (its row kept until then).
    done_ids = {r["id"] for r in rows if r["fault"] != "evaluator" or _refused(r)}
    summaries = [summary(level, [r for r in rows if r["level"] == level], walls.get(level, 0.0))
                 for level in sorted({r["level"] for r in rows})]
    ran = False
    pool = LocalPool(None if gpu else ["cpu"], jobs_per_gpu=args.jobs_per_gpu)
    with tempfile.TemporaryDirectory(prefix="kernelbench-") as scratch:
        for level in levels:
            queued = [t for t in tasks if t.level == level and t.id not in done_ids]
            if not queued:
                continue
            ran = True
            again = {t.id for t in queued}
            earlier_rows = [r for r in rows if r["level"] == level and r["id"] not in again]
            rows = [r for r in rows if r["level"] != level]
            summaries = [s for s in summaries if s["level"] != level]
            started = time.monotonic()
            futures = {pool.submit(EvalJob(job_id=f"kb-{t.id}", task_id=t.id, task_code=t.code,
                                           language="cuda" if gpu else "cpp", device="cuda" if gpu else "cpu",
                                           mode=Mode.FINAL, settings=SETTINGS,
                                           snapshot_dir=own_model_as_candidate(t, Path(scratch) / t.id))): t
                       for t in queued}
            level_rows = []
            for done, future in enumerate(as_completed(futures), 1):
                task = futures[future]
                row = record(task, future.result(), published)
                level_rows.append(row)
                ratio = row["candidate_over_eager"]
                print(f"[{time.monotonic() - started:6.0f}s] L{level} {done}/{len(queued)} {task.id} {task.name}: "
                      f"reward {row['reward']}, eager {row['eager_ms']}, compile {row['compile_ms']}, "
                      f"candidate {row['candidate_ms']} ({'—' if ratio is None else f'{ratio:.2f}'}x eager), "
                      f"{row['seconds']} s" + (f"; {row['fault'] or 'candidate'}: {row['error']}" if row["error"] else "")
                      + (f"; {row['violations'][0]}" if row["violations"] else ""), flush=True)
                so_far = summary(level, earlier_rows + level_rows, walls.get(level, 0.0) + time.monotonic() - started)
                save(rows + earlier_rows + level_rows, sorted([*summaries, so_far], key=lambda s: s["level"]))
            level_rows += earlier_rows
            summaries.append(summary(level, level_rows, walls.get(level, 0.0) + time.monotonic() - started))
            order = {t.id: i for i, t in enumerate(tasks)}
            rows += sorted(level_rows, key=lambda r: order.get(r["id"], len(order)))
            summaries.sort(key=lambda s: s["level"])
            save(rows, summaries)
    pool.close()
    print_summaries(summaries)
    if args.json:
        print(f"wrote {args.json}" if ran else f"nothing left to run: {args.json} unchanged")

if __name__ == "__main__":
    main()
