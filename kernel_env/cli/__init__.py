"""The ``kernel-env`` command line. It renders what the library computes, for people (rich) and
for machines (``--json``), and decides nothing the library does not: each module below parses
its options, calls the library and renders the result.

    tasks SOURCE          list a task source; --check runs each task once in the probe   tasks.py
    baseline SOURCE       measure and cache eager / torch.compile times                  tasks.py
    headers [LANGUAGE]    precompile torch's headers for workspace builds                 tasks.py
    doctor                what this machine has and what that means for kernel_env       doctor.py
    run-task TASK         a shell in the task's sandboxed workspace, or --solution DIR    run_task.py
    image build KIND      the docker sandbox's and GPU workers' images                    image.py
    synth                 synthesise a task set (subcommands: seeds, stats, decontam)     synth.py
    generate              refine-loop traces (SFT data) from a model server               generate.py
    eval SOURCE           a tool-calling model as a KernelAgent-v0 agent over a task set  eval.py
    report RUN            an eval run's metrics again, from its run file                  eval.py
    export RUN            an eval run's trajectories for rejection fine-tuning (filtered)   eval.py
    openhands TASK        an OpenHands agent on one task, in its sandbox                  openhands.py
    serve                 KernelAgent-v0 or KernelRefine-v0 as an OpenEnv server          serve.py

Shared: ``common.py`` (exit codes, the consoles that wrap only on a terminal, ``fail``, JSON,
the phases of long jobs, the command classes every command is made with, Ctrl-C for async runs),
``options.py`` (every option more than one command takes), ``sources.py`` (loading and
filtering a task source). Exit codes mean the same everywhere:

    0    ok
    1    the task failed (a malformed task, a solution that does not build or is wrong)
    2    usage or environment error (bad arguments, no terminal, a missing tool)
    130  interrupted (generate, eval, synth: what finished is kept; rerun to resume)

Progress and errors go to stderr, results to stdout, so ``--json`` output can be piped.
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


# In the order `kernel-env --help` lists them.
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
