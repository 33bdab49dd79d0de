"""``kernel-env run-task``: work on one task in its sandboxed workspace, as an agent would.

Two modes. Without ``--solution``: an interactive shell in the sandbox, on this terminal
(``kernel_env.sandbox.interactive.run_shell`` holds it as the agent's commands are held), with
the episode's broker so ``utils.verification`` and ``utils.profiling`` work; where the
language cannot be evaluated here, a shell that can only edit and compile. With ``--solution
DIR``: DIR (model_new.py, kernels/…) is copied into a fresh workspace and goes through the
agent's compile → verify → profile path, then the trusted final evaluation; the last line of
``--json`` output is one JSON object (``solution_record``: ``EvalResult.summary()`` with
``error`` saying why whenever the solution is not correct, ``build_ok``, ``build_seconds`` and
``verdict``; ``fault`` says whose fault a failure is; README.md lists every field). The summary
line on stderr names the verdict too ("did not build", "wrong answer", ...). Exit 0 ok (the
solution is correct), 1 it is not, 2 usage or environment error, an evaluation that failed by
the evaluator's fault included.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.panel import Panel

from kernel_env.cli import options
from kernel_env.cli.common import (
    EXIT_OK,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    ObservedPool,
    StepLines,
    Phases,
    err,
    fail,
    out,
    render_result_table,
)
from kernel_env.cli.sources import resolve
from kernel_env.config import DEFAULT_SANDBOX, workspaces_dir
from kernel_env.languages import get_language
from kernel_env.tasks import Task

if TYPE_CHECKING:
    from kernel_env.evaluators.records import EvalResult
    from kernel_env.sandbox.base import ExecResult


def run_task(
    task: options.TaskSpec,
    language: options.LanguageOrAuto = None,
    sandbox: options.Sandbox = options.SandboxKind(DEFAULT_SANDBOX),
    keep: bool = typer.Option(True, "--keep/--no-keep", help="Keep the workspace when the shell exits (default: keep, "
                                                              "so what you wrote survives; its path is printed)."),
    kernelbench: options.KernelBench = None,
    solution: Path | None = typer.Option(None, "--solution", help="Run this solution folder (model_new.py, kernels/) "
                                                                   "through compile → verify → profile instead of opening a shell."),
    device: options.Device = None,
    as_json: options.Json = False,
) -> None:
    """Work on one task in its sandboxed workspace: an interactive shell, or (--solution DIR) run a solution.

    --json goes with --solution: the solution's result as one JSON object on the last line."""
    if solution is None and as_json:
        fail("--json belongs to solution mode: add --solution DIR")
    from kernel_env.runtime.episode import language_and_device

    spec = resolve(task, kernelbench)
    where = device.value if device else None  # None: the machine's, and no device was asked for
    chosen, _ = language_and_device(language.value if language else None, where)
    if solution is not None:
        raise typer.Exit(_run_solution(spec, solution, language=chosen, sandbox=sandbox.value, device=where,
                                       as_json=as_json))
    raise typer.Exit(_run_interactive(spec, language=chosen, sandbox_kind=sandbox.value, keep=keep, device=where))


# ----------------------------------------------------------------------------- the shell


def _run_interactive(task: Task, *, language: str, sandbox_kind: str, keep: bool, device: str | None) -> int:
    from kernel_env.sandbox import SandboxError
    from kernel_env.sandbox.interactive import run_shell

    if not sys.stdin.isatty():
        fail("run-task opens an interactive shell and needs a terminal, but stdin is not one. Run it from a terminal, "
             "or pass --solution DIR to run a solution without one.")
    episode, workspace, box, note = _open_episode(task, language=language, sandbox_kind=sandbox_kind, device=device)
    err.print(_welcome(task, language, sandbox_kind, getattr(box, "isolated", True), box.workdir, workspace.path,
                       keep, note))
    problem = None
    try:
        run_shell(box, workspace.path, warn=lambda line: err.print(f"[yellow]note:[/] {escape(line)}"))
    except SandboxError as exc:
        problem = f"task {task.id}: {exc}"
    finally:
        if episode is not None:
            episode.close(keep_workspace=True)
        else:
            box.close()
        if keep:
            tampered = workspace.tampered_files()
            if tampered:
                err.print(f"[yellow]note:[/] protected files changed: {', '.join(tampered)}")
            # soft_wrap: the command stays one line (to copy), however narrow the terminal.
            err.print(f"workspace kept: {escape(str(workspace.path))}\n"
                      f"  remove it with: chmod -R u+w {escape(str(workspace.root))} && rm -rf {escape(str(workspace.root))}",
                      soft_wrap=True)
        else:
            workspace.destroy()
    if problem:
        fail(problem)
    return EXIT_OK


def _welcome(task: Task, language: str, sandbox_kind: str, isolated: bool, workdir: str, path: Path, keep: bool,
             note: str | None) -> Panel:
    lang = get_language(language)
    compile_cmd = "TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh" if lang.needs_cuda else "bash utils/compile.sh"
    commands = [
        ("compile", compile_cmd + ("" if lang.builds_extension else "   (checks model_new.py and kernels/*.py)")),
        ("verify", "python3 -m utils.verification"),
        ("profile", "python3 -m utils.profiling"),
    ]
    lines = [
        f"[bold]task[/]       {escape(task.id)}  ({escape(task.name)}, hash {task.hash})",
        f"[bold]language[/]   {language}",
        f"[bold]workspace[/]  {escape(str(path))}  (inside the sandbox: {workdir})",
        f"[bold]sandbox[/]    {sandbox_kind}: " + (("bubblewrap" if sandbox_kind == "local" else "a container")
                                                 + ", no network, protected files read-only" if isolated
                                                 else "[red]NOT ISOLATED[/] (see `kernel-env doctor`)"),
        "",
        "Read SKILL.md first. Your files: model_new.py and kernels/. Commands:",
        *[f"  {label:<8} [cyan]{escape(cmd)}[/]" for label, cmd in commands],
        "",
        "Leave with [bold]exit[/] or Ctrl-D." + (" The workspace is kept." if keep else " The workspace is deleted then (--no-keep)."),
        *([f"[yellow]note:[/] {escape(note)}"] if note else []),
    ]
    return Panel("\n".join(lines), title="kernel-env run-task", expand=False)


def _open_episode(task: Task, *, language: str, sandbox_kind: str, device: str | None):
    """(episode or None, workspace, sandbox, note): the agent's episode set-up, broker included, so that
    utils.verification and utils.profiling work in the shell. Where the language cannot be evaluated here
    (cuda without a GPU, and no --device asked for), a workspace and sandbox without evaluation, and a note."""
    from kernel_env.runtime.episode import Episode, EpisodeError
    from kernel_env.sandbox import SandboxError, make_sandbox
    from kernel_env.workspace import Workspace

    try:
        episode = Episode.open(task, language=language, device=device, sandbox=sandbox_kind)
        return episode, episode.workspace, episode.sandbox, None
    except EpisodeError as exc:
        if device is not None:
            fail(f"task {task.id}: {exc}")
        note = f"{exc}. This shell can edit and compile, but verification and profiling cannot run here."
    except SandboxError as exc:
        fail(f"task {task.id}: {exc}")
    except OSError as exc:
        fail(f"task {task.id}: cannot set up the workspace under {workspaces_dir()}: {exc}")
    try:
        workspace = Workspace.create(task, language)
    except OSError as exc:
        fail(f"cannot create a workspace for {task.id} under {workspaces_dir()}: {exc}")
    try:
        box = make_sandbox(sandbox_kind, workspace)
        box.start()
    except SandboxError as exc:
        workspace.destroy()
        fail(f"task {task.id}: {exc}")
    return None, workspace, box, note


# ----------------------------------------------------------------------------- --solution DIR


def _run_solution(task: Task, solution: Path, *, language: str, sandbox: str, device: str | None,
                  as_json: bool) -> int:
    """The solution through the agent's path, its phases on stderr (a live line on a terminal,
    stamped lines in a log), then the build's last line, the report and the table on stdout."""
    from kernel_env.evaluators.records import Mode
    from kernel_env.evaluators.report import model_report
    from kernel_env.runtime.episode import COMPILE_COMMAND, Episode, EpisodeError
    from kernel_env.runtime.pool import default_pool
    from kernel_env.sandbox import SandboxError

    if not (solution / "model_new.py").is_file():
        fail(f"solution {solution}: no model_new.py there (a solution folder holds model_new.py and kernels/)")
    try:
        with Phases(quiet=False) as phases, StepLines(phases) as steps:  # on stderr: --json's stdout stays one JSON object
            # The pool says when the evaluation begins: the build is over then. Its steps show as they begin.
            def evaluating(job) -> None:
                phases.start("verifying and timing", f"the trusted evaluation on {_where(job.device)}")
                steps.follow(job)

            pool = ObservedPool(default_pool(), evaluating)
            phases.start("setting up", f"{task.id}: its workspace and sandbox")
            episode = Episode.open(task, language=language, device=device, sandbox=sandbox, pool=pool)
            try:
                copied = episode.workspace.copy_solution(solution)
                phases.start("building", f"the {episode.language.name} solution ({', '.join(copied)}) with "
                                         f"{COMPILE_COMMAND}")
                build, result = episode.build_and_evaluate(Mode.FINAL)
            finally:
                episode.close(keep_workspace=False)
    except (EpisodeError, SandboxError) as exc:
        fail(f"task {task.id}: {exc}")
    if build.ok and not as_json:  # the build's last line, before the verdict (a failed build's output is in the report)
        last = build.output.strip().splitlines()[-1] if build.output.strip() else "ok"
        out.print(f"[dim]build: {escape(last)}[/]", soft_wrap=True)
    phases.note(f"done in {phases.elapsed:.1f} s: {verdict(build, result)}, reward "
                f"{'—' if result.reward is None else f'{result.reward:g}'} ({phases.summary()})")
    if as_json:
        # One object on one line: the contract is that the last line of output is the result.
        sys.stdout.write(json.dumps(solution_record(build, result)) + "\n")
    else:
        out.print(escape(model_report(result)))
        render_result_table(result)
    if result.fault == "evaluator":
        err.print("[bold red]error:[/] the evaluation failed by the evaluator's fault, not the solution's; "
                  "`kernel-env doctor` checks this machine", soft_wrap=True)
        return EXIT_USAGE
    return EXIT_OK if result.correct else EXIT_TASK_FAILED


def verdict(build: ExecResult, result: EvalResult) -> str:
    """The outcome in a few words: the summary line's and ``--json``'s ``verdict``."""
    if result.fault == "evaluator":
        return "evaluator fault"
    if not build.ok:
        return "did not build"
    if result.correct:
        return "correct"
    if not result.compiled:
        return "did not load"
    if _wrong_trial(result) is not None:
        return "wrong answer"
    if result.violations:
        return "broke a rule"
    return "failed"


def why_not_correct(result: EvalResult) -> str | None:
    """Why a solution is not correct: the evaluation's error (a failed build, a crash, a time-out), else its
    first wrong trial (how many elements, how far off) and the rules it broke; None when correct."""
    if result.correct or result.error:
        return result.error
    reasons = []
    trial = _wrong_trial(result)
    if trial is not None:
        reasons.append(f"wrong answer in trial {trial.trial + 1}: {trial.message}")
    reasons += [f"rule violation: {violation}" for violation in result.violations]
    return "; ".join(reasons) or "not correct (the evaluation recorded no reason)"


def solution_record(build: ExecResult, result: EvalResult) -> dict:
    """``run-task --json``'s object: ``EvalResult.summary()``, its ``error`` saying why whenever the solution is
    not correct, and the build's outcome and the verdict (README.md, the field list)."""
    return {**result.summary(), "error": why_not_correct(result), "build_ok": build.ok,
            "build_seconds": build.duration_s, "verdict": verdict(build, result)}


def _wrong_trial(result: EvalResult):
    return next((trial for trial in result.trials if not trial.correct), None)


def _where(device: str) -> str:
    return "the CPU" if device == "cpu" else "the GPU" if device == "cuda" else device
