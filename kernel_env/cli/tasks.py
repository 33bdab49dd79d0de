"""``kernel-env tasks``, ``baseline`` and ``headers``: a task source, its baselines, the build headers.

``tasks`` lists a source and (``--check``) runs each task in the locked-down probe of
``kernel_env.tasks.validate_task``, which refuses a task that a trivial answer passes; ``baseline`` fills the eager / torch.compile timing cache
through the trusted harness; ``headers`` precompiles torch's headers. Exit 1 when a task (or a
baseline, or a header build) failed.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernel_env.cli import options
from kernel_env.cli.common import EXIT_OK, EXIT_TASK_FAILED, err, fail, out, print_json, progress_bar, stamped
from kernel_env.cli.sources import load_source, select
from kernel_env.tasks import Task, TaskError, validate_task


def tasks(
    source: options.Source,
    level: options.Level = None,
    name: options.Name = None,
    count: options.Count = None,
    sample: options.Sample = None,
    seed: options.SampleSeed = 0,
    check: bool = typer.Option(False, "--check", help="Run each task in a locked-down probe and report the bad ones: "
                                                      "those that fail, and those a trivial answer (zeros, a constant, "
                                                      "a copied input) passes."),
    allow_trivial: bool = typer.Option(False, "--allow-trivial", help="With --check: accept tasks a trivial answer "
                                                                      "passes (listed as warnings). Evaluations refuse "
                                                                      "them unless EvalSettings.refuse_trivial_tasks "
                                                                      "is off."),
    jobs: int = typer.Option(max(1, min(4, os.cpu_count() or 1)), "--jobs", min=1, help="Probes run at once with --check."),
    as_json: options.Json = False,
) -> None:
    """List the tasks of a source (id, level, name, content hash); --check validates and screens them."""
    selected = select(load_source(source), level=level, name=name, sample=sample, seed=seed, count=count)
    results = _check_all(selected, jobs, quiet=as_json, allow_trivial=allow_trivial) if check else None
    bad = [task for task in selected if results and isinstance(results[task.id], TaskError)]

    if as_json:
        records = []
        for task in selected:
            record = {k: v for k, v in task.to_record().items() if k != "code"}
            if results is not None:
                result = results[task.id]
                record["ok"] = not isinstance(result, TaskError)
                record["error"] = str(result) if isinstance(result, TaskError) else None
                if not isinstance(result, TaskError):
                    record.update(inputs=result.inputs, outputs=result.outputs, screened=result.screened,
                                  trivial=result.trivial, warnings=result.warnings)
            records.append(record)
        print_json(records)
    else:
        _render_task_table(selected, results)
    raise typer.Exit(EXIT_TASK_FAILED if bad else EXIT_OK)


def baseline(
    source: options.Source,
    level: options.Level = None,
    name: options.Name = None,
    count: options.Count = None,
    device: options.Device = None,
    as_json: options.Json = False,
) -> None:
    """Measure eager and torch.compile times for a task source; torch.compile's is cached, with the eager time
    beside it (by task hash, device, torch version)."""
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines
    from kernel_env.runtime.episode import default_device

    selected = select(load_source(source), level=level, name=name, count=count)
    where = device.value if device else default_device()
    cache = BaselineCache()
    rows = []
    with progress_bar(disable=as_json) as progress:
        bar = progress.add_task(f"baselines on {where}", total=len(selected))
        for task in selected:
            progress.update(bar, description=f"baselines on {where}: {task.id}")
            result = measure_baselines(task.id, task.code, device=where, baselines=cache)
            rows.append({"task_id": task.id, "device_name": result.device_name, "eager_ms": result.eager_ms,
                         "compile_ms": result.compile_ms, "error": result.error})
            progress.advance(bar)
    if as_json:
        print_json(rows)
    else:
        table = Table(title=f"baselines ({escape(str(cache.directory))})")
        for column in ("task", "device", "eager ms", "compile ms", "error"):
            table.add_column(column)
        for row in rows:
            fmt = lambda v: "—" if v is None else f"{v:.4f}"  # noqa: E731
            table.add_row(escape(row["task_id"]), escape(row["device_name"] or where), fmt(row["eager_ms"]),
                          fmt(row["compile_ms"]), escape(row["error"] or ""))
        out.print(table)
    raise typer.Exit(EXIT_TASK_FAILED if any(r["error"] for r in rows) else EXIT_OK)


def headers(
    language: list[str] = typer.Argument(None, help="cpp and/or cuda (default: those this machine can use: cpp, "
                                                    "and cuda where there is a GPU and nvcc)."),
) -> None:
    """Precompile torch's headers for workspace builds with this host's toolchain (about half of a
    binding source's compile time). Sandboxes also do this in the background on first use."""
    from kernel_env import headers as precompiled
    from kernel_env.runtime.episode import default_device

    for name in language or []:
        if name not in precompiled.LANGUAGES:
            fail(f"no headers to precompile for {name!r}; choose from {', '.join(precompiled.LANGUAGES)}")
    names, skipped = (language, {}) if language else precompiled.worth_making(default_device())
    for name, why in skipped.items():
        out.print(f"{name}: skipped ({escape(why)}); `kernel-env headers {name}` makes it anyway", soft_wrap=True)
    failed = False
    for name in names:
        with err.status(f"precompiling torch headers for {name} workspaces (about half a minute)"):
            proc = precompiled.precompile(name)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        out.print(f"{name}: {escape(lines[-1] if lines else f'exit status {proc.returncode}')}", soft_wrap=True)
        failed |= proc.returncode != 0
    raise typer.Exit(EXIT_TASK_FAILED if failed else EXIT_OK)


def _check_all(selected: list[Task], jobs: int, *, quiet: bool, allow_trivial: bool = False) -> dict[str, object]:
    """Each task's TaskInfo, or the TaskError its probe raised, by task id (``jobs`` probes at once)."""
    results: dict[str, object] = {}

    def probe(task: Task):
        try:
            return task, validate_task(task, allow_trivial=allow_trivial)
        except TaskError as exc:
            return task, exc

    progress = Progress(TextColumn("checking tasks"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=err, transient=True, disable=quiet or not selected)
    started = time.monotonic()
    with progress, ThreadPoolExecutor(max_workers=jobs) as pool:
        bar = progress.add_task("", total=len(selected))
        for done, (task, result) in enumerate(pool.map(probe, selected), start=1):
            results[task.id] = result
            progress.update(bar, advance=1, description=task.id)
            if not quiet and not err.is_terminal:  # a log gets a line per task (a terminal, the bar)
                verdict = "bad" if isinstance(result, TaskError) else "trivial" if result.trivial else "ok"
                err.print(escape(stamped(time.monotonic() - started, f"checked {done}/{len(selected)}: {task.id}: "
                                                                      f"{verdict}")), soft_wrap=True)
    return results


def _check_cell(result: object) -> str:
    if isinstance(result, TaskError):
        return "[red]✗ bad[/]"
    if result.trivial:
        return "[yellow]! trivial[/]"
    return "[green]✓ ok[/]"


def _render_task_table(selected: list[Task], results: dict[str, object] | None) -> None:
    table = Table(show_edge=False, header_style="bold")
    for column in ("id", "level", "name", "hash", *(["check"] if results is not None else [])):
        table.add_column(column, overflow="fold")
    for task in selected:
        row = [task.id, "" if task.level is None else str(task.level), task.name, task.hash]
        if results is not None:
            row.append(_check_cell(results[task.id]))
        table.add_row(*[cell if cell.startswith("[") else escape(cell) for cell in row])
    out.print(table)
    bad = [str(r) for r in (results or {}).values() if isinstance(r, TaskError)]
    for line in bad:
        out.print(f"[red]✗[/] {escape(line)}", soft_wrap=True)
    for task_id, info in (results or {}).items():
        if not isinstance(info, TaskError):
            for warning in [*info.trivial, *info.warnings]:
                out.print(f"[yellow]![/] task {escape(task_id)}: {escape(warning)}", soft_wrap=True)
    summary = f"{len(selected)} task{'s' if len(selected) != 1 else ''}"
    if results is not None:
        summary += f": {len(selected) - len(bad)} ok, {len(bad)} bad"
        unscreened = sum(1 for r in results.values() if not isinstance(r, TaskError) and not r.screened)
        if unscreened:
            summary += (f"; {unscreened} too large to screen for trivial answers on this CPU (every evaluation screens "
                        "its task on its own device)")
    out.print(summary)
