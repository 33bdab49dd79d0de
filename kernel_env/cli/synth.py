"""``kernel-env synth``: a task set made like CUDA-Agent-Ops-6K, and its stages one at a time.

``synth`` runs ``kernel_env.workloads.runs.synth.pipeline`` (crawl → compose → decontaminate →
filter), resumable: rerun the same command to go on where it stopped. ``synth seeds`` lists the
crawl, ``synth stats SOURCE`` prints Table 3 of any task set, ``synth decontam SOURCE`` checks
one against an evaluation set. Exit codes: 0 the output holds --count tasks; 1 fewer
(--max-candidates ran out first); 2 usage or environment error; 130 interrupted (the output so
far is written: rerun to resume).
"""

from __future__ import annotations

import enum
import random
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from kernel_env import config
from kernel_env.cli import options
from kernel_env.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TASK_FAILED,
    Command,
    Group,
    err,
    fail,
    out,
    print_json,
    progress_bar,
    stamped,
)
from kernel_env.cli.sources import load_source
from kernel_env.tasks import Task
from kernel_env.workloads.runs.llm import DEFAULT_BASE_URL

app = typer.Typer(help="Synthesise training tasks (CUDA-Agent-Ops-6K pipeline): compose torch operators, "
                       "decontaminate, filter in isolated processes. Subcommands inspect the stages.", cls=Group)
ComposerName = enum.Enum("ComposerName", {"deterministic": "deterministic", "llm": "llm"}, type=str)
SizeName = enum.Enum("SizeName", {"realistic": "realistic", "small": "small"}, type=str)


@app.callback(invoke_without_command=True)
def synth(
    ctx: typer.Context,
    composer: ComposerName = typer.Option(ComposerName("deterministic"), "--composer",
                                          help="deterministic (shape-checked chaining, no model) or llm (the model "
                                               "server of --base-url, --model, --api-key, --temperature, --max-tokens)."),
    count: int = typer.Option(100, "--count", min=1, help="Tasks to keep (the output's size)."),
    out_path: Path = typer.Option(Path("synth_tasks.jsonl"), "--out", "-o", help="The task set: .jsonl or .parquet."),
    device: options.Device = None,
    size: SizeName = typer.Option(SizeName("realistic"), "--size",
                                  help="Input sizes: realistic (largest tensor about 1 GiB: an H100 takes a millisecond "
                                       "or more; the CPU, with its scaled time bounds, the same tasks) or small (a few "
                                       "thousand elements: quick offline runs, with --min-ms/--max-ms to match)."),
    seed: int = typer.Option(0, "--seed", help="Candidate i is composed from (seed, i): the same seed, the same candidates."),
    max_candidates: int | None = typer.Option(None, "--max-candidates", min=1, help="Compose at most this many "
                                                                                     "(default 20 × --count)."),
    jobs: int | None = typer.Option(None, "--jobs", min=1, help="Candidates screened at once per device (default: 4 "
                                                               "per GPU, 1 on the CPU); timing is always exclusive."),
    eval_set: str | None = typer.Option(None, "--eval-set", help="Decontamination set (any `tasks` source; 'none' for "
                                                                 "none). Default: $KERNEL_ENV_KERNELBENCH, else the bundled examples."),
    threshold: options.Threshold = 0.9,
    min_ms: float | None = typer.Option(None, "--min-ms", min=0.0, help="Eager time floor (default 1 ms on cuda; 50 ms on the CPU)."),
    max_ms: float | None = typer.Option(None, "--max-ms", min=0.0, help="Eager time ceiling (default 100 ms on cuda; 5000 ms on the CPU)."),
    timed_calls: int = typer.Option(10, "--timed-calls", min=1, help="Timed eager calls per candidate (median)."),
    op_weights: str | None = typer.Option(None, "--op-weights", help="Weights of 1,2,…,5-operator compositions "
                                                                     "(default the paper's mix: 3.4,83.77,7.62,2.8,1.23)."),
    no_transformers: options.NoTransformers = False,
    ops: str | None = typer.Option(None, "--ops", help="Compose only these seed classes (comma-separated names, "
                                                       "e.g. Linear,Conv2d,ReLU; `kernel-env synth seeds` lists them)."),
    transformers_share: float = typer.Option(0.0118, "--transformers-share", min=0.0, max=1.0,
                                             help="Share of standalone transformers tasks (where installed)."),
    base_url: options.BaseUrl = DEFAULT_BASE_URL,
    model: options.Model = None,
    api_key: options.ApiKey = "EMPTY",
    temperature: options.Temperature = 0.7,
    max_tokens: options.MaxTokens = None,
    compose_jobs: int = typer.Option(4, "--compose-jobs", min=1, help="Model requests in flight (--composer llm)."),
    work_dir: Path | None = typer.Option(None, "--work-dir", help="State folder (default: OUT.synth/)."),
    compile_cache: Path | None = typer.Option(None, "--compile-cache", help="torch.compile cache the filter's processes "
                                                                           "share (default: in the state folder)."),
    restart: bool = typer.Option(False, "--restart", help="Forget the state of an earlier run with this output."),
    as_json: options.Json = False,
) -> None:
    """Make a task set: compose, decontaminate and filter candidates until --count are kept. Resumable."""
    if ctx.invoked_subcommand is not None:
        return
    from kernel_env.runtime.episode import default_device
    from kernel_env.workloads.runs.synth.compose import PAPER_OP_COUNT_WEIGHTS
    from kernel_env.workloads.runs.synth.filter import FilterSettings
    from kernel_env.workloads.runs.synth.pipeline import SynthConfig, SynthError, run

    where = device.value if device else default_device()
    if out_path.suffix not in (".jsonl", ".parquet"):
        fail(f"--out {out_path}: give a .jsonl or .parquet file")
    eval_tasks, eval_name, note = _eval_set(eval_set)
    settings = FilterSettings(device=where, min_ms=min_ms, max_ms=max_ms, timed_calls=timed_calls,
                              jobs_per_device=jobs or (4 if where == "cuda" else 1))
    config = SynthConfig(
        out=out_path, count=count, composer=composer.value, seed=seed, size=size.value,
        op_weights=_op_weights(op_weights) or dict(PAPER_OP_COUNT_WEIGHTS), transformers=not no_transformers,
        ops=[name.strip() for name in ops.split(",") if name.strip()] if ops else None,
        transformers_share=transformers_share, max_candidates=max_candidates, eval_tasks=eval_tasks,
        eval_name=eval_name, threshold=threshold, filter=settings, work_dir=work_dir, compile_cache=compile_cache,
        base_url=base_url, model=model, api_key=api_key, temperature=temperature, max_tokens=max_tokens,
        compose_jobs=compose_jobs)
    low, high = settings.bounds()
    if not as_json:
        err.print(f"synth: {count} tasks into {escape(str(out_path))} ({composer.value} composer, {config.size} sizes, "
                  f"filter on {where} within [{low:g}, {high:g}] ms, decontaminated against {escape(eval_name)}; "
                  f"state in {escape(str(config.state_dir))})", soft_wrap=True)
    started = time.monotonic()
    with progress_bar(disable=as_json or not err.is_terminal) as progress:
        bar = progress.add_task("kept", total=count)

        def report(p) -> None:
            progress.update(bar, completed=min(p.kept, count),
                            description=f"kept · {p.dropped} contaminated · {p.rejected} rejected · {p.screening} screening")
            if not err.is_terminal and not as_json:
                err.print(escape(stamped(time.monotonic() - started, p.event)), soft_wrap=True)

        try:
            summary = run(config, restart=restart, on_progress=report, notes=[note] if note else [])
        except SynthError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] the tasks kept so far are in {escape(str(out_path))}; rerun the same "
                      "command to go on")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        print_json(summary.to_record())
    else:
        _render_summary(summary)
    raise typer.Exit(EXIT_OK if summary.complete else EXIT_TASK_FAILED)


@app.command("stats", cls=Command)
def stats(source: options.Source, as_json: options.Json = False) -> None:
    """The share of 1- … 5-operator compositions and transformers tasks in a task set (Table 3)."""
    from kernel_env.workloads.runs.synth.stats import composition_stats

    found = composition_stats(load_source(source))
    if as_json:
        print_json(found.to_record())
    else:
        _render_stats(found)


@app.command("seeds", cls=Command)
def seeds(
    output: Path | None = typer.Option(None, "--out", "-o", help="Also write each seed as a one-operator task (.jsonl/.parquet)."),
    size: SizeName = typer.Option(SizeName("realistic"), "--size", help="Input sizes of the written tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed of the written tasks' sizes."),
    no_transformers: options.NoTransformers = False,
    as_json: options.Json = False,
) -> None:
    """The crawl: which torch.nn (and transformers) classes are seeds, and why the others are not."""
    from kernel_env.tasks.sources import write_records
    from kernel_env.workloads.runs.synth.compose import seed_task
    from kernel_env.workloads.runs.synth.crawl import PRESETS, crawl

    found = crawl(transformers=not no_transformers)
    if output is not None:
        rng = random.Random(seed)
        written = []
        for s in found.seeds:
            code = seed_task(s, PRESETS[size.value], rng)
            if code:
                written.append(Task(id=f"seed/{s.library}/{s.name}", code=code, source="synthetic", name=s.name,
                                    metadata={"ops": [s.name], "data_source": f"{s.library}#1"}))
        write_records(written, output)
    rows = [{"name": s.name, "module": s.module, "kind": s.kind, "ranks": list(s.ranks)} for s in found.seeds]
    if as_json:
        print_json({"seeds": rows, "skipped": found.skipped, "notes": found.notes})
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("seed", "module", "kind", "input ranks"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["module"], row["kind"], ",".join(map(str, row["ranks"])))
    out.print(table)
    reasons: dict[str, int] = {}
    for reason in found.skipped.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    out.print(f"{len(rows)} seeds; {len(found.skipped)} classes skipped: "
              + "; ".join(f"{n} {escape(r)}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])))
    for line in found.notes:
        out.print(f"[yellow]note:[/] {escape(line)}", soft_wrap=True)


@app.command("decontam", cls=Command)
def decontam(
    source: str = typer.Argument(..., help="The task set to check (any `tasks` source)."),
    eval_set: str = typer.Option(..., "--eval-set", help="The evaluation set (any `tasks` source, e.g. a KernelBench checkout)."),
    threshold: options.Threshold = 0.9,
    out_dir: Path = typer.Option(Path("decontam"), "--out-dir", help="Where kept.jsonl, dropped.jsonl and similarity.png go."),
    as_json: options.Json = False,
) -> None:
    """Decontaminate a task set: kept.jsonl, dropped.jsonl and the similarity histogram in --out-dir."""
    from kernel_env.tasks.sources import write_records
    from kernel_env.workloads.runs.synth.decontam import decontaminate, write_dropped, write_histogram

    tasks = load_source(source)
    report = decontaminate(tasks, load_source(eval_set), threshold=threshold)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept_ids = report.kept_ids()
    write_records([t for t in tasks if t.id in kept_ids], out_dir / "kept.jsonl")
    write_dropped(report.dropped, out_dir / "dropped.jsonl")
    why_not = write_histogram([m.similarity for m in report.matches], threshold, out_dir / "similarity.png",
                              title=f"{source} vs {eval_set}")
    record = {"tasks": len(tasks), "kept": len(kept_ids), "dropped": [m.to_record() for m in report.dropped],
              "histogram": None if why_not else str(out_dir / "similarity.png"), "note": why_not}
    if as_json:
        print_json(record)
        return
    for match in report.dropped:
        out.print(f"dropped {escape(match.task_id)}: similarity {match.similarity:.3f} to {escape(str(match.nearest))}")
    out.print(f"{len(kept_ids)} of {len(tasks)} tasks kept ({escape(str(out_dir / 'kept.jsonl'))}); "
              f"histogram: {escape(record['histogram'] or why_not or '')}")


def _op_weights(text: str | None) -> dict[int, float] | None:
    if text is None:
        return None
    from kernel_env.workloads.runs.synth.compose import check_weights

    try:
        values = [float(part) for part in text.split(",") if part.strip()]
        return check_weights({count: weight for count, weight in enumerate(values, 1)})
    except ValueError as exc:
        fail(f"--op-weights {text!r}: {exc} (give up to 5 comma-separated weights for 1, 2, … 5 operators)")


def _eval_set(spec: str | None) -> tuple[list[Task], str, str | None]:
    """The decontamination set: --eval-set, else $KERNEL_ENV_KERNELBENCH, else the bundled examples (with a note)."""
    note = None
    if spec is None:
        spec = config.kernelbench_root()
        if not spec:
            spec = "examples"
            note = ("decontaminated against the bundled examples only: pass --eval-set KernelBench/ (or set "
                    "KERNEL_ENV_KERNELBENCH) for the real check")
    if spec == "none":
        return [], "none", "decontamination is off (--eval-set none)"
    return load_source(spec), spec, note


def _render_summary(summary) -> None:
    out.print(f"{summary.written} of {summary.count} tasks in {escape(str(summary.out))} from {summary.candidates} "
              f"candidates ({', '.join(f'{n} {k}' for k, n in sorted(summary.by_stage.items())) or 'none judged'})")
    for reason, n in list(summary.reasons.items())[:8]:
        out.print(f"  {n:>5}  {escape(reason)}", soft_wrap=True)
    if summary.screen_seconds.get("screened"):
        out.print(f"screening: {summary.screen_seconds['screened']} candidates, median "
                  f"{summary.screen_seconds['median']:.1f} s each (in parallel)")
    _render_stats(summary.stats)
    out.print(f"similarity histogram: {escape(str(summary.histogram)) if summary.histogram else '—'}; "
              f"dropped list: {escape(str(summary.dropped_list))}")
    for line in summary.notes:
        out.print(f"[yellow]note:[/] {escape(line)}", soft_wrap=True)


def _render_stats(stats) -> None:
    table = Table(title="composition (the paper's Table 3)", show_edge=False, header_style="bold")
    for column in ("category", "tasks", "share", "paper"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for row in stats.rows():
        table.add_row(row["category"], str(row["count"]), f"{row['share']:.2f} %", f"{row['paper_share']:.2f} %")
    out.print(table)
    if stats.unknown:
        out.print(f"{stats.unknown} tasks have no composition metadata (no data_source or ops) and are not counted")
