"""``kernel-env eval``, ``report`` and ``export``: a tool-calling model as a KernelAgent-v0 agent,
its metrics, and its trajectories for rejection fine-tuning.

``eval`` runs ``kernel_env.workloads.runs.agent_eval`` over a task set, appending one episode record
per task to a JSONL run file, then shows the metrics (``kernel_env.workloads.analysis.metrics``, rendered
by ``kernel_env.workloads.analysis.report``); ``report`` rebuilds the metrics of a run file; ``export``
writes its trajectories that pass an RFT filter (``kernel_env.workloads.analysis.trajectories``). eval's exit
codes: 0 every selected task has an episode record that did not end in error; 1 some episodes
ended in error (the model's calls failed: rerun to retry them); 2 usage or environment error
(bad source, bad settings, an output that is not a run file, server unreachable, or a final
evaluation that failed by the evaluator's fault: rerun to retry those); 130
interrupted (every finished record is kept: rerun to resume).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from kernel_env.cli import options
from kernel_env.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    ObservedPool,
    check_server,
    end_of_run,
    err,
    fail,
    out,
    print_json,
    progress_bar,
    run_interruptibly,
    stamped,
)
from kernel_env.cli.sources import select, source_or_task
from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.workloads.runs.llm import DEFAULT_BASE_URL, TOOL_SERVE_HINT


def eval_command(
    source: str = typer.Argument(..., help="'examples', a task .py file, a .jsonl of task records, a KernelBench "
                                           "checkout, or one task's id (example/relu_add)."),
    level: options.Level = None,
    name: options.Name = None,
    count: options.Count = None,
    sample: options.Sample = None,
    seed: options.SampleSeed = 0,
    model: options.Model = None,
    base_url: options.BaseUrl = DEFAULT_BASE_URL,
    api_key: options.ApiKey = "EMPTY",
    language: options.LanguageOrAuto = None,
    device: options.Device = None,
    sandbox: options.Sandbox = options.SandboxKind(DEFAULT_SANDBOX),
    concurrency: int = typer.Option(8, "--concurrency", "-j", min=1, help="Episodes in flight at once."),
    max_turns: int = typer.Option(200, "--max-turns", min=1, help="Turns per episode (the paper evaluates with 200)."),
    max_context_tokens: int = typer.Option(131_072, "--max-context-tokens", min=1,
                                           help="An episode whose conversation reaches this many tokens (as the "
                                                "server counts them) ends there with its final evaluation, as at "
                                                "the turn limit (the paper: a 128k context)."),
    temperature: options.ServerTemperature = None,
    max_tokens: options.MaxTokens = None,
    request_timeout: options.RequestTimeout = 900.0,
    settings_json: options.Settings = None,
    output: Path = typer.Option(Path("run.jsonl"), "--output", "-o", help="Episode records (JSONL). Rerunning with the "
                                                                          "same file skips tasks already done."),
    plot: options.Plot = None,
    markdown_path: options.Markdown = None,
    as_json: options.Json = False,
) -> None:
    """Evaluate a tool-calling model as a KernelAgent-v0 agent over a task set: pass rate, faster rates, geomean speed-ups."""
    _check_stdout(as_json, markdown_path)
    settings = options.parse_settings(settings_json)
    selected = select(source_or_task(source), level=level, name=name, sample=sample, seed=seed, count=count)
    if not selected:
        fail(f"task source {source}: no task matches the filters")
    done = {r.task_id for r in (_read_run(output) if output.is_file() else []) if r.stop != "error"}
    server = check_server(base_url, model, api_key, serve_hint=TOOL_SERVE_HINT)

    from kernel_env.runtime.pool import default_pool  # torch, after the checks that need none
    from kernel_env.workloads.runs.agent_eval import AgentRunConfig, EvalRunError, run_agent_eval

    progress = _EvalProgress(total=sum(task.id not in done for task in selected), quiet=as_json,
                             title=f"{len(selected)} tasks, {concurrency} at a time")
    config = AgentRunConfig(base_url=server.base_url, model=server.model, api_key=api_key,
                            language=language.value if language else None, device=device.value if device else None,
                            sandbox=sandbox.value, max_turns=max_turns, max_context_tokens=max_context_tokens,
                            concurrency=concurrency,
                            temperature=temperature, max_tokens=max_tokens, request_timeout=request_timeout,
                            settings=settings,
                            pool=ObservedPool(default_pool(), progress.evaluation))  # the pool tells the progress
    with progress:
        try:
            summary = run_interruptibly(run_agent_eval(selected, config, output, on_record=progress.episode,
                                                         on_turn=progress.turn))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] finished episodes are in {escape(str(output))}; rerun the same command to go on")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except EvalRunError as exc:
            fail(str(exc))
    wanted = {task.id for task in selected}
    records = [record for record in _read_run(output) if record.task_id in wanted]
    _show_metrics(records, plot=plot, markdown_path=markdown_path, as_json=as_json,
                  extra={"output": str(output), "model": summary.model, "selected": summary.selected,
                         "skipped": summary.skipped, "finished": summary.finished, "turn_limit": summary.turn_limit,
                         "context_limit": summary.context_limit,
                         "errors": summary.errors, "evaluator_faults": summary.evaluator_faults})
    if not as_json:
        err.print(f"{summary.written} new episode records in {escape(str(output))} ({summary.skipped} tasks were done "
                  f"already); model {escape(summary.model)}")
    raise typer.Exit(end_of_run(err, failed=summary.errors, evaluator_faults=summary.evaluator_faults, quiet=as_json,
                                fault_note="the evaluator's fault, not the model's: no reward recorded"))


_EVALUATIONS = {"verify": "verification", "profile": "profiling", "final": "final evaluation"}  # by job mode


class _EvalProgress:
    """eval's progress on stderr: a bar of the episodes (on a terminal), and a line per evaluation
    an episode asks for and per episode that ends (above the bar on a terminal; in a log, stamped
    with the seconds since the run started). ``evaluation`` and ``episode`` may be called from any
    thread."""

    def __init__(self, *, total: int, quiet: bool, title: str):
        self.quiet, self.live = quiet, not quiet and err.is_terminal
        self.started = time.monotonic()
        self.progress = progress_bar(disable=not self.live)
        self.bar = self.progress.add_task(title, total=total)
        self.evaluations: dict[str, int] = {}
        self.turns: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> _EvalProgress:
        self.started = time.monotonic()
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def evaluation(self, job) -> None:
        """An episode's evaluation was handed to the pool (``ObservedPool``'s callback)."""
        count = self.evaluations[job.task_id] = self.evaluations.get(job.task_id, 0) + 1
        self._line(f"{job.task_id}: {_EVALUATIONS.get(job.mode.value, job.mode.value)} "
                   f"(evaluation {count} of the episode)")

    def turn(self, task_id: str, turn: int, max_turns: int) -> None:
        """An episode took a step (run_agent_eval's ``on_turn``): the turns of every episode in flight."""
        self.turns[task_id] = (turn, max_turns)
        if self.live:
            running = " · ".join(f"{task} {done}/{limit}" for task, (done, limit) in list(self.turns.items())[-3:])
            self.progress.update(self.bar, description=f"turns: {running}")
        else:
            self._line(f"{task_id}: turn {turn} of {max_turns}")

    def episode(self, record, summary) -> None:
        """An episode ended and its record is written (run_agent_eval's ``on_record``)."""
        self.turns.pop(record.task_id, None)
        self.progress.update(self.bar, total=summary.to_do, completed=summary.written,
                             description=f"{summary.finished} finished · "
                                         f"{summary.turn_limit + summary.context_limit} at a limit · "
                                         f"{len(summary.errors)} errors · {len(summary.evaluator_faults)} evaluator faults")
        final = record.final or {}
        turns = f"{record.turns} turn{'s' if record.turns != 1 else ''}"
        self._line(f"{record.task_id}: {record.stop} after {turns} ({record.duration_s:.0f} s), reward "
                   f"{record.reward if record.reward is not None else '—'}, correct {final.get('correct')}"
                   + (f" ({record.error})" if record.error else ""))

    def _line(self, text: str) -> None:
        if not self.quiet:
            err.print(escape(text if self.live else stamped(time.monotonic() - self.started, text)), soft_wrap=True)


def report(
    run: Path = typer.Argument(..., help="A run file written by `kernel-env eval` (JSONL episode records)."),
    plot: options.Plot = None,
    markdown_path: options.Markdown = None,
    as_json: options.Json = False,
) -> None:
    """Rebuild an eval run's metrics tables (and plot) from its run file."""
    _check_stdout(as_json, markdown_path)
    records = _read_run(run)
    if not records:
        fail(f"run file {run}: no episode records in it")
    _show_metrics(records, plot=plot, markdown_path=markdown_path, as_json=as_json, extra={"output": str(run)})
    raise typer.Exit(EXIT_OK)


def export(
    run: Path = typer.Argument(..., help="A run file written by `kernel-env eval` (JSONL episode records)."),
    output: Path = typer.Option(Path("trajectories.jsonl"), "--output", "-o",
                                help="The kept trajectories (JSONL chat records: messages, tools, reward, ...)."),
    min_reward: float = typer.Option(0.0, "--min-reward", help="Keep episodes whose reward is above this."),
    max_invalid_calls: int = typer.Option(0, "--max-invalid-calls", min=0, help="Keep episodes with at most this "
                                                                                  "many invalid tool calls."),
    max_repeated_calls: int = typer.Option(0, "--max-repeated-calls", min=0,
                                           help="Keep episodes with at most this many repeated calls (the same call "
                                                "and output as an earlier one: a loop)."),
    max_tool_errors: int | None = typer.Option(None, "--max-tool-errors", min=0,
                                               help="Keep episodes with at most this many failed tool calls "
                                                    "(default: any)."),
    as_json: options.Json = False,
) -> None:
    """Write an eval run's trajectories for rejection fine-tuning: by default the paper's filter (reward > 0, no
    invalid calls, no loops)."""
    from kernel_env.workloads.analysis.trajectories import RftFilter, export as export_trajectories

    keep = RftFilter(min_reward=min_reward, max_invalid_calls=max_invalid_calls,
                     max_repeated_calls=max_repeated_calls, max_tool_errors=max_tool_errors)
    records = _read_run(run)
    try:
        done = export_trajectories(records, output, keep)
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    if as_json:
        print_json({"output": str(output), "records": len(records), "written": done.written,
                    "dropped": dict(done.dropped)})
    else:
        out.print(f"{done.written} of {len(records)} trajectories written to {escape(str(output))}", soft_wrap=True)
        for why, count in done.dropped.most_common():
            out.print(f"  dropped {count}: {escape(why)}", soft_wrap=True)
    raise typer.Exit(EXIT_OK)


def _check_stdout(as_json: bool, markdown_path: Path | None) -> None:
    if as_json and str(markdown_path) == "-":
        fail("--json and --markdown - would both write to stdout; give --markdown a file")


def _read_run(path: Path) -> list:
    from kernel_env.workloads.analysis.metrics import RecordError, read_records

    try:
        return read_records(path)
    except RecordError as exc:
        fail(str(exc))


def _show_metrics(records: list, *, plot: Path | None, markdown_path: Path | None, as_json: bool,
                  extra: dict[str, Any]) -> None:
    """The metrics of ``records``: rich tables (or JSON) on stdout, markdown and the plot where asked."""
    from kernel_env.workloads.analysis.metrics import compute_metrics
    from kernel_env.workloads.analysis.report import PlotUnavailable, describe, markdown, plot_speedups, rich_report

    metrics = compute_metrics(records)
    title = describe(records)
    notes: dict[str, str] = {}
    if markdown_path is not None:
        text = markdown(metrics, title=title)
        if str(markdown_path) == "-":
            sys.stdout.write(text)
        else:
            try:
                markdown_path.write_text(text)
            except OSError as exc:
                fail(f"--markdown {markdown_path}: {exc.strerror or exc}")
            notes["markdown"] = str(markdown_path)
    if plot is not None:
        try:
            notes["plot"] = str(plot_speedups(records, plot, title=title))
        except PlotUnavailable as exc:
            notes["plot_skipped"] = str(exc)
        except OSError as exc:
            fail(f"--plot {plot}: {exc.strerror or exc}")
    if as_json:
        print_json({**extra, "title": title, "metrics": metrics.to_dict(), **notes})
        return
    if str(markdown_path) != "-":
        for part in rich_report(metrics, title=title):
            out.print(part)
    for what in ("markdown", "plot"):
        if what in notes:
            err.print(f"{what}: {escape(notes[what])}")
    if "plot_skipped" in notes:
        err.print(f"[yellow]note:[/] plot skipped: {escape(notes['plot_skipped'])}")
