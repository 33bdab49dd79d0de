"""What every ``kernel-env`` command shares: the exit codes, the two consoles, failing, printing,
the phases and progress of long jobs.

Results go to stdout (``out``), progress and errors to stderr (``err``), so ``--json`` output
can be piped. The consoles are configured here, once, for both audiences: on a terminal rich
wraps text at the terminal's width; anywhere else (a pipe, a log, CI) a line is never broken
(soft wrap) and tables are laid out at their natural width, not squeezed into 80 columns
(``COLUMNS`` set in the environment still sets the width). Tables are designed to fit 80
columns. Nothing here knows about a particular command, and nothing here decides what the
library decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from rich import box
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from typer.core import TyperCommand, TyperGroup

from kernel_env.evaluators.report import speedup_text

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # what a shell reports for Ctrl-C: resumable runs end with it

#: The width tables get where output is not a terminal: wide enough that rich never wraps a cell.
UNWRAPPED_WIDTH = 10_000


class CliConsole(Console):
    """A rich console that hard-wraps only on a terminal.

    Elsewhere ``print`` soft-wraps (a line stays one line, whatever its length: grep and CI logs
    read it whole) and the width is ``UNWRAPPED_WIDTH`` unless ``COLUMNS`` or ``width=`` names one.
    Both are read at each print, so a console made at import follows where its stream goes
    (a test runner swapping sys.stdout included)."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **options: Any) -> None:
        super().print(*objects, soft_wrap=(not self.is_terminal) if soft_wrap is None else soft_wrap, **options)

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        columns = self._environ.get("COLUMNS", "")
        if self.is_terminal or self._width is not None or columns.isdigit():
            return size
        return ConsoleDimensions(UNWRAPPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


out = CliConsole(highlight=False)
err = CliConsole(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with ``code`` (default: usage error)."""
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def check_server(base_url: str, model: str | None, api_key: str, *, serve_hint: str):
    """The model server a long run (eval, generate) will ask, checked first: one quick request,
    before the run imports torch or writes anything, so a server that is not there is reported in
    well under a second. Returns the ``Server`` (the address that answered, the model to ask);
    fails as a usage error with ``connect``'s message."""
    from kernel_env.workloads.runs.llm import RunError, connect

    try:
        return connect(base_url, model, api_key=api_key, serve_hint=serve_hint)
    except RunError as exc:
        fail(str(exc))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# ----------------------------------------------------------------------------- help


class _Help:
    """Help that reads well on a terminal and in a pipe.

    On a terminal typer's rich panels, wrapped at its width. Elsewhere click's plain layout with
    no width limit: each option's help stays on the option's line, so
    ``kernel-env eval --help | grep device`` finds it whole. An on/off flag shows just its
    name(s): typer writes a ``<bool>`` placeholder beside ``--json`` or ``--grade/--no-grade``,
    as if they took a value."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params

    def format_help(self, ctx, formatter):
        if out.is_terminal:
            return super().format_help(ctx, formatter)
        formatter.width = UNWRAPPED_WIDTH
        markup, self.rich_markup_mode = self.rich_markup_mode, None  # typer's switch to the plain layout
        try:
            return super().format_help(ctx, formatter)
        finally:
            self.rich_markup_mode = markup


class Command(_Help, TyperCommand):
    """The class of every kernel-env command (``app.command(name, cls=Command)``)."""


class Group(_Help, TyperGroup):
    """The class of kernel-env and its command groups (``typer.Typer(cls=Group)``). A usage error
    is typer's red panel on a terminal, click's plain lines elsewhere (never wrapped)."""

    def main(self, *args, **kwargs):
        if not err.is_terminal:
            self.rich_markup_mode = None
        return super().main(*args, **kwargs)


# ----------------------------------------------------------------------------- progress


def end_of_run(console: Console, *, failed: dict[str, str], evaluator_faults: dict[str, str], quiet: bool,
               fault_note: str) -> int:
    """Name what a long run (eval, generate) left to do, and its exit code: 2 when any evaluation
    failed by the evaluator's fault (this machine's problem, and nothing a model did), else 1 when
    some items failed, else 0. Both kinds are retried by a rerun."""
    if not quiet:
        for key, why in failed.items():
            console.print(f"[red]✗[/] {escape(key)}: {escape(why)} (a rerun tries it again)", soft_wrap=True)
        for key, why in evaluator_faults.items():
            console.print(f"[red]✗[/] {escape(key)}: {escape(why)} ({fault_note}; a rerun tries it again)", soft_wrap=True)
    return EXIT_USAGE if evaluator_faults else EXIT_TASK_FAILED if failed else EXIT_OK


def progress_bar(*, disable: bool) -> Progress:
    """The progress bar of a long job, on stderr: a description, the bar, done/total and the time taken."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=disable)


def stamped(seconds: float, line: str) -> str:
    """A progress line for a log: the seconds since the job started, then what happens."""
    return f"[{seconds:6.1f} s] {line}"


class Phases:
    """The phases of one long job on stderr, each with its time.

    On a terminal: a live line (a spinner, the phase, its time so far) and, as each phase ends,
    a line with its time. Elsewhere (a log): a plain line as each phase starts, stamped with the
    seconds since the job started (``stamped``), and one every ``QUIET_S`` seconds that nothing else
    is said (``still ...``), so no phase is silent longer. ``quiet`` shows nothing (``--json``).
    ``seconds`` holds each finished phase's time, for the caller's summary::

        with Phases(quiet=as_json) as phases:
            phases.start("setting up")
            ...
            phases.start("building")
    """

    #: In a log, the longest a phase goes without a line.
    QUIET_S = 5.0

    def __init__(self, *, quiet: bool = False):
        self.quiet = quiet
        self.seconds: dict[str, float] = {}
        self._live = not quiet and err.is_terminal
        # The phase's text gives way (an ellipsis) before its time does, in a narrow terminal.
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}", table_column=Column(
            ratio=1, no_wrap=True, overflow="ellipsis")), TimeElapsedColumn(), console=err, transient=True, expand=True,
                                  disable=not self._live)
        self._bar = None
        self._phase: str | None = None
        self._lock = threading.Lock()
        self.started = self._phase_started = self._said = time.monotonic()
        self._doing = ""  # what the last line said is going on (the phase, or its step)
        self._done = threading.Event()

    def __enter__(self) -> Phases:
        self.started = self._phase_started = self._said = time.monotonic()
        self._progress.start()
        self._done.clear()
        if not self.quiet and not self._live:
            threading.Thread(target=self._tick, daemon=True, name="kernel_env-phases").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        with self._lock:
            self._end_phase(failed=exc[0] is not None)
        self._progress.stop()

    def _tick(self) -> None:
        """In a log: a ``still ...`` line once nothing has been said for ``QUIET_S`` seconds."""
        while not self._done.wait(min(0.5, self.QUIET_S / 4)):
            with self._lock:
                now = time.monotonic()
                if self._phase is not None and now - self._said >= self.QUIET_S:
                    into = "" if self._doing == self._phase else f" into {self._phase}"
                    self._print(f"  still {self._doing} ({now - self._phase_started:.0f} s{into})")

    def _print(self, line: str) -> None:
        """A stamped line in the log (under the lock)."""
        err.print(escape(stamped(self.elapsed, line)), soft_wrap=True)
        self._said = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def start(self, phase: str, detail: str = "") -> None:
        """End the current phase (if any) and start ``phase`` (its name in ``seconds``), shown as
        ``phase: detail``. Plain text: neither is read as markup."""
        with self._lock:
            self._end_phase()
            self._phase, self._phase_started = phase, time.monotonic()
            line = f"{phase}: {detail}" if detail else phase
            self._doing = phase
            if self._live:
                if self._bar is None:
                    self._bar = self._progress.add_task(escape(line), total=None)
                else:
                    self._progress.reset(self._bar, description=escape(line))
            elif not self.quiet:
                self._print(line)

    def step(self, text: str) -> None:
        """What the current phase is doing now (plain text): the live line's on a terminal, else an
        indented stamped line in the log (a long phase is never silent)."""
        with self._lock:
            if self.quiet or self._phase is None:
                return
            self._doing = text
            if self._live:
                self._progress.reset(self._bar, description=escape(f"{self._phase}: {text}"))
            else:
                self._print(f"  {text}")

    def summary(self) -> str:
        """Each finished phase and its time: ``setting up 1.8 s, building 38.4 s``."""
        return ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.seconds.items())

    def note(self, line: str) -> None:
        """A line beside the phases (plain text): stamped in a log, above the live line on a terminal."""
        if self.quiet:
            return
        with self._lock:
            if self._live:
                err.print(escape(line), soft_wrap=True)
            else:
                self._print(line)

    def _end_phase(self, *, failed: bool = False) -> None:
        if self._phase is None:
            return
        took = time.monotonic() - self._phase_started
        self.seconds[self._phase] = took
        if self._live and not failed:
            err.print(f"[green]✓[/] {escape(self._phase)} [dim]({took:.1f} s)[/]", soft_wrap=True)
        self._phase = None


class StepLines(logging.Handler):
    """Each step of the evaluations a ``Phases`` shows (``job.steps_log``), as its ``step`` line: use it
    as a context manager around the evaluation; ``follow(job)`` names the job to show."""

    def __init__(self, phases: Phases):
        super().__init__(logging.INFO)
        self.phases, self.job_id = phases, None

    def follow(self, job) -> None:
        self.job_id = job.job_id

    def emit(self, record: logging.LogRecord) -> None:
        if self.job_id is not None and getattr(record, "job_id", None) == self.job_id:
            self.phases.step(record.getMessage())

    def __enter__(self) -> StepLines:
        from kernel_env.evaluators.job import steps_log

        self._level = steps_log.level
        steps_log.addHandler(self)
        steps_log.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        from kernel_env.evaluators.job import steps_log

        steps_log.removeHandler(self)
        steps_log.setLevel(self._level)


class ObservedPool:
    """A GpuPool that tells ``on_job`` of each job before ``pool`` runs it: how the CLI learns that
    an evaluation begins (the build before it is over). The pool is borrowed (the process's shared
    one): closing the observer leaves it running."""

    def __init__(self, pool, on_job: Callable[[Any], None]):
        self.pool, self.on_job = pool, on_job

    def submit(self, job):
        self.on_job(job)
        return self.pool.submit(job)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- results


def render_result_table(result) -> None:
    """One evaluation's ``EvalResult`` as a one-row table (within 80 columns): correct, reward, times, speed-ups."""
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.4f}"

    def x(value: float | None) -> str:
        return "—" if value is None else speedup_text(value)

    table = Table(title=f"{escape(result.task_id)} ({result.language}, {escape(result.device_name or result.device)})",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("correct", "reward", "ModelNew\nms", "eager\nms", "compile\nms", "speed-up\nvs eager",
                   "speed-up\nvs compile"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row("yes" if result.correct else "[red]no[/]", f"{result.reward:g}" if result.reward is not None else "—",
                  ms(result.runtime_ms), ms(result.eager_ms), ms(result.compile_ms), x(result.speedup_vs_eager),
                  x(result.speedup_vs_compile))
    out.print(table)


# ----------------------------------------------------------------------------- Ctrl-C


def run_interruptibly(coro) -> Any:
    """``asyncio.run(coro)``, with Ctrl-C cancelling it at once and raising KeyboardInterrupt.

    asyncio.run's own handler runs only when the event loop next wakes, and a SIGINT sent to the
    process may be taken by any of its threads without waking the loop's wait: a loop waiting on
    a model's answer then sat out the answer (a test saw 60 s). Here the signal wakes the loop."""
    return asyncio.run(_cancelled_on_sigint(coro))


async def _cancelled_on_sigint(coro) -> Any:
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (ValueError, RuntimeError):  # not the main thread: nothing to wake
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
