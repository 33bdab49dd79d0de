"""What every ``kernel-env`` command shares: the exit codes, the two consoles, failing, printing.

Results go to stdout (``out``), progress and errors to stderr (``err``), so ``--json`` output
can be piped. Nothing here knows about a particular command, and nothing here decides what
the library decides.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # what a shell reports for Ctrl-C: resumable runs end with it

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with ``code`` (default: usage error)."""
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def progress_bar(*, disable: bool) -> Progress:
    """The progress bar of a long job, on stderr: a description, the bar, done/total and the time taken."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=disable)


def render_result_table(result) -> None:
    """One evaluation's ``EvalResult`` as a one-row table: correct, reward, times, speed-ups."""
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.4f}"

    def x(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}x"

    table = Table(title=f"{escape(result.task_id)} ({result.language}, {escape(result.device_name or result.device)})")
    for column in ("correct", "reward", "ModelNew ms", "eager ms", "compile ms", "vs eager", "vs compile"):
        table.add_column(column, justify="right")
    table.add_row("yes" if result.correct else "[red]no[/]", f"{result.reward:g}" if result.reward is not None else "—",
                  ms(result.runtime_ms), ms(result.eager_ms), ms(result.compile_ms), x(result.speedup_vs_eager),
                  x(result.speedup_vs_compile))
    out.print(table)


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
