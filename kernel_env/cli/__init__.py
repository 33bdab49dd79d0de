"""The ``kernel-env`` command line (``app``). It renders what the library computes, for people
(rich) and for machines (``--json``), and decides nothing the library does not: each module below
parses its options, calls the library and renders the result. A command's help is its function's
docstring (a group's, its Typer's ``help``; ``kernel-env``'s, ``app``'s): this one is no one's.

    tasks.py      tasks, baseline, headers       eval.py       eval, report, export
    doctor.py     doctor                         generate.py   generate
    run_task.py   run-task                       openhands.py  openhands
    image.py      image build                    serve.py      serve
    synth.py      synth (and seeds, stats, decontam)

Shared: ``common.py`` (exit codes, the consoles, ``fail``, JSON, progress, the command classes),
``options.py`` (the options several commands take), ``sources.py`` (loading and filtering a task
source). Exit codes mean the same everywhere: 0 ok; 1 the work failed, all or in part (a malformed
task, a solution that does not build or is wrong, episodes or samples that ended in error, too few
tasks); 2 a usage or environment error, or an evaluator's fault; 130 interrupted (generate, eval,
synth keep what finished: rerun to resume). Progress and errors go to stderr, results to stdout,
so ``--json`` output can be piped.
"""

from __future__ import annotations

import importlib.metadata

import typer

from kernel_env.cli import doctor, eval, generate, image, openhands, run_task, serve, synth, tasks
from kernel_env.cli.common import EXIT_OK, Command, Group, out

app = typer.Typer(
    name="kernel-env",
    help="RL environments for GPU kernel engineering: list and check tasks, inspect this machine, "
         "work on a task in its sandbox.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def _print_version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("kernel_env")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        out.print(f"kernel-env {version}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                       callback=_print_version)) -> None:
    pass


# In the order `kernel-env --help` lists them (typer lists the groups, image and synth, after the commands).
app.command("tasks", cls=Command)(tasks.tasks)
app.command("baseline", cls=Command)(tasks.baseline)
app.command("headers", cls=Command)(tasks.headers)
app.command("doctor", cls=Command)(doctor.doctor)
app.command("run-task", cls=Command)(run_task.run_task)
app.add_typer(image.app, name="image")
app.add_typer(synth.app, name="synth")
app.command("generate", cls=Command)(generate.generate)
app.command("eval", cls=Command)(eval.eval_command)
app.command("report", cls=Command)(eval.report)
app.command("export", cls=Command)(eval.export)
app.command("openhands", cls=Command)(openhands.openhands)
app.command("serve", cls=Command)(serve.serve)
