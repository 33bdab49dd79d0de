"""The ``kernel-env`` command line: ``tasks``, ``doctor``, ``run-task``.

It renders what the library computes, for people (rich) and for machines (``--json``), and
decides nothing the library does not. Exit codes mean the same everywhere:

    0  ok
    1  the task failed (a malformed task, a solution that does not build or is wrong)
    2  usage or environment error (bad arguments, no terminal, a missing tool)

Progress and errors go to stderr, results to stdout, so ``--json`` output can be piped.
"""

from __future__ import annotations

import enum
import importlib.metadata
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernel_env.config import DEFAULT_LANGUAGE, DEFAULT_SANDBOX, workspaces_dir
from kernel_env.languages import LANGUAGES, get_language
from kernel_env.tasks import Task, TaskError, load_tasks, resolve_task, validate_task

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="kernel-env",
    help="RL environments for GPU kernel engineering: list and check tasks, inspect this machine, "
         "work on a task in its sandbox.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

LanguageName = enum.Enum("LanguageName", {name: name for name in LANGUAGES}, type=str)
SandboxKind = enum.Enum("SandboxKind", {"local": "local"}, type=str)


class Device(str, enum.Enum):
    cuda = "cuda"
    cpu = "cpu"


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _print_version(value: bool) -> None:
    if value:
        out.print(f"kernel-env {_version('kernel_env') or 'unknown'}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                       callback=_print_version)) -> None:
    pass


# ============================================================================= tasks


@app.command()
def tasks(
    source: str = typer.Argument(..., help="'examples', a task .py file, a .jsonl of task records, or a KernelBench checkout."),
    level: int | None = typer.Option(None, "--level", help="Only tasks of this level."),
    name: str | None = typer.Option(None, "--name", help="Only tasks whose id or name contains this (case-insensitive)."),
    count: int | None = typer.Option(None, "--count", min=1, help="At most this many tasks (after the other filters)."),
    sample: int | None = typer.Option(None, "--sample", min=1, help="A random sample of this many tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample (the same seed gives the same sample)."),
    check: bool = typer.Option(False, "--check", help="Run each task once in a locked-down probe and report the bad ones."),
    jobs: int = typer.Option(max(1, min(4, os.cpu_count() or 1)), "--jobs", min=1, help="Probes run at once with --check."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """List the tasks of a source (id, level, name, content hash); --check validates them."""
    selected = _select(_load_source(source), level=level, name=name, sample=sample, seed=seed, count=count)
    results = _check_all(selected, jobs, quiet=as_json) if check else None
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
                    record.update(inputs=result.inputs, outputs=result.outputs)
            records.append(record)
        _print_json(records)
    else:
        _render_task_table(selected, results)
    raise typer.Exit(EXIT_TASK_FAILED if bad else EXIT_OK)


@app.command()
def baseline(
    source: str = typer.Argument(..., help="'examples', a task .py file, a .jsonl of task records, or a KernelBench checkout."),
    level: int | None = typer.Option(None, "--level", help="Only tasks of this level."),
    name: str | None = typer.Option(None, "--name", help="Only tasks whose id or name contains this (case-insensitive)."),
    count: int | None = typer.Option(None, "--count", min=1, help="At most this many tasks (after the other filters)."),
    device: Device | None = typer.Option(None, "--device", help="Where to measure (default: cuda if there is a GPU, else cpu)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Measure and cache eager and torch.compile times for a task source (by task hash, device, torch version)."""
    from kernel_env.episode import default_device
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines

    selected = _select(_load_source(source), level=level, name=name, sample=None, seed=0, count=count)
    where = device.value if device else default_device()
    cache = BaselineCache()
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json) as progress:
        bar = progress.add_task(f"baselines on {where}", total=len(selected))
        for task in selected:
            progress.update(bar, description=f"baselines on {where}: {task.id}")
            result = measure_baselines(task.id, task.code, device=where, baselines=cache)
            rows.append({"task_id": task.id, "device_name": result.device_name, "eager_ms": result.eager_ms,
                         "compile_ms": result.compile_ms, "error": result.error})
            progress.advance(bar)
    if as_json:
        _print_json(rows)
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


def _load_source(source: str) -> list[Task]:
    if source not in ("examples", "example") and not Path(source).expanduser().exists():
        _fail(f"task source {source}: no such file or folder (give 'examples', a .py, a .jsonl or a KernelBench checkout)")
    try:
        return load_tasks(source)
    except TaskError as exc:
        # The source itself is unusable (a usage error), or one of its tasks is malformed (the task failed).
        _fail(str(exc), EXIT_USAGE if str(exc).startswith("task source ") else EXIT_TASK_FAILED)
    except OSError as exc:
        _fail(f"task source {source}: {exc.strerror or exc}")


def _select(found: list[Task], *, level: int | None, name: str | None, sample: int | None, seed: int,
            count: int | None) -> list[Task]:
    selected = [t for t in found if level is None or t.level == level]
    if name:
        needle = name.lower()
        selected = [t for t in selected if needle in t.name.lower() or needle in t.id.lower()]
    if sample is not None and sample < len(selected):
        chosen = set(random.Random(seed).sample(range(len(selected)), sample))
        selected = [t for i, t in enumerate(selected) if i in chosen]  # keep the source's order
    return selected[:count] if count is not None else selected


def _check_all(selected: list[Task], jobs: int, *, quiet: bool) -> dict[str, object]:
    results: dict[str, object] = {}

    def probe(task: Task):
        try:
            return task, validate_task(task)
        except TaskError as exc:
            return task, exc

    progress = Progress(TextColumn("checking tasks"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=err, transient=True, disable=quiet or not selected)
    with progress, ThreadPoolExecutor(max_workers=jobs) as pool:
        bar = progress.add_task("", total=len(selected))
        for task, result in pool.map(probe, selected):
            results[task.id] = result
            progress.update(bar, advance=1, description=task.id)
    return results


def _render_task_table(selected: list[Task], results: dict[str, object] | None) -> None:
    table = Table(show_edge=False, header_style="bold")
    for column in ("id", "level", "name", "hash", *(["check"] if results is not None else [])):
        table.add_column(column, overflow="fold")
    for task in selected:
        row = [task.id, "" if task.level is None else str(task.level), task.name, task.hash]
        if results is not None:
            row.append("[red]✗ bad[/]" if isinstance(results[task.id], TaskError) else "[green]✓ ok[/]")
        table.add_row(*[cell if cell.startswith("[") else escape(cell) for cell in row])
    out.print(table)
    bad = [str(r) for r in (results or {}).values() if isinstance(r, TaskError)]
    for line in bad:
        out.print(f"[red]✗[/] {escape(line)}", soft_wrap=True)
    summary = f"{len(selected)} task{'s' if len(selected) != 1 else ''}"
    if results is not None:
        summary += f": {len(selected) - len(bad)} ok, {len(bad)} bad"
    out.print(summary)


# ============================================================================= doctor


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON.")) -> None:
    """What this machine has (GPU, compilers, sandbox, tools) and what that means for kernel_env."""
    facts = _gather_facts()
    meaning, essential_missing = _interpret(facts)
    if as_json:
        _print_json({"ok": not essential_missing, "facts": facts, "meaning": meaning, "missing": essential_missing})
    else:
        _render_doctor(facts, meaning, essential_missing)
    raise typer.Exit(EXIT_USAGE if essential_missing else EXIT_OK)


def _run_quiet(argv: list[str], timeout: float = 10.0) -> str | None:
    """First meaningful output of a command, or None if it is missing or fails."""
    if not shutil.which(argv[0]) and not os.path.isabs(argv[0]):
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gather_facts() -> dict[str, Any]:
    from kernel_env.sandbox.limits import Cgroup, Limits
    from kernel_env.sandbox.local import bubblewrap_problem

    facts: dict[str, Any] = {
        "python": {"version": sys.version.split()[0], "executable": sys.executable, "ok": sys.version_info >= (3, 12)},
        "root": os.geteuid() == 0,
    }

    try:
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        facts["torch"] = {"version": torch.__version__, "cuda_build": torch.version.cuda, "gpus": gpus}
    except Exception as exc:  # noqa: BLE001 (a broken torch install is a finding, not a crash)
        facts["torch"] = {"version": None, "error": f"{type(exc).__name__}: {exc}"}
    facts["triton"] = {"version": _version("triton")}

    smi = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    facts["nvidia_smi"] = {"present": shutil.which("nvidia-smi") is not None,
                           "gpus": [line.strip() for line in smi.splitlines()] if smi else []}

    nvcc = shutil.which("nvcc") or next((p for p in (os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                                                     "/usr/local/cuda/bin/nvcc") if os.path.isfile(p)), None)
    nvcc_out = _run_quiet([nvcc, "--version"]) if nvcc else None
    release = re.search(r"release ([\d.]+)", nvcc_out or "")
    facts["nvcc"] = {"path": nvcc, "version": release.group(1) if release else None}

    problem = bubblewrap_problem()
    bwrap_version = _run_quiet(["bwrap", "--version"])
    facts["bubblewrap"] = {"version": bwrap_version.split()[-1] if bwrap_version else None, "works": problem is None,
                           "problem": problem}
    group = Cgroup.create(Limits())
    if group is not None:
        version = "v1" if len(group.dirs) > 1 else "v2"  # v1: one folder per controller (pids, memory)
        group.destroy()
        facts["cgroup"] = {"available": True, "version": version}
    else:
        facts["cgroup"] = {"available": False, "version": None}

    venv_bin = str(Path(sys.executable).parent)
    search_path = venv_bin + os.pathsep + os.environ.get("PATH", "")
    ninja = shutil.which("ninja", path=search_path)
    facts["ninja"] = {"version": _run_quiet([ninja, "--version"]) if ninja else None}
    gxx = _run_quiet(["g++", "--version"])
    facts["g++"] = {"version": gxx.splitlines()[0] if gxx else None}
    rg = _run_quiet(["rg", "--version"])
    facts["ripgrep"] = {"version": rg.splitlines()[0].split()[1] if rg else None}
    docker_client = _run_quiet(["docker", "--version"])
    docker_engine = _run_quiet(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=5) if docker_client else None
    facts["docker"] = {"client": docker_client, "engine": docker_engine or None}
    return facts


def _interpret(f: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Plain sentences on what the facts mean, and the essentials that are missing."""
    from kernel_env.sandbox.limits import Limits

    meaning, missing = [], []
    if not f["python"]["ok"]:
        missing.append(f"Python 3.12 or newer (this is {f['python']['version']})")
    torch = f["torch"]
    if not torch.get("version"):
        missing.append(f"PyTorch ({torch.get('error')})")

    gpus, nvcc = torch.get("gpus") or [], f["nvcc"]["version"]
    if gpus:
        meaning.append(f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(sorted(set(gpus)))}): cuda, triton "
                       "and cpp solutions can be evaluated; timings use the GPU pool.")
        if not nvcc:
            meaning.append("no nvcc: cuda kernels cannot be compiled here (install the CUDA toolkit or set CUDA_HOME).")
    elif f["nvidia_smi"]["gpus"]:
        meaning.append(f"nvidia-smi sees {', '.join(f['nvidia_smi']['gpus'])} but torch does not (a CPU build of torch, "
                       f"or a driver mismatch): only CPU evaluation is possible until torch sees the GPU.")
    else:
        compile_note = f"cuda tasks can be compiled (nvcc {nvcc}) but not evaluated" if nvcc else \
            "cuda tasks can be neither compiled (no nvcc) nor evaluated"
        meaning.append(f"no GPU: {compile_note}; cpp and triton (interpreter) run on the CPU.")

    if not f["g++"]["version"] or not f["ninja"]["version"]:
        absent = " and ".join(name for name in ("g++", "ninja") if not f[name]["version"])
        meaning.append(f"no {absent}: utils/compile.sh cannot build cpp or cuda kernels; triton still works.")

    bwrap, cgroup = f["bubblewrap"], f["cgroup"]
    if bwrap["works"]:
        meaning.append("the local sandbox isolates agents with bubblewrap: read-only toolchain and protected files, "
                       "private /tmp, no network, own pid namespace, non-root uid.")
    else:
        meaning.append(f"the local sandbox is NOT isolated: {bwrap['problem']}. Agent commands would run on this host "
                       "with resource limits only; do not run untrusted agents here.")
    limits = Limits()
    if cgroup["available"]:
        meaning.append(f"a cgroup ({cgroup['version']}) caps each sandbox as a whole: {limits.processes} processes, "
                       f"{limits.memory_bytes >> 30} GiB of memory.")
    else:
        per_process = f"each process is capped at {limits.address_space_bytes >> 30} GiB of address space"
        if f["root"]:
            meaning.append(f"no cgroup can be created and this runs as root: the process-count limit does NOT hold (the "
                           f"kernel ignores RLIMIT_NPROC for root) and there is no whole-sandbox memory cap; {per_process}.")
        else:
            meaning.append(f"no cgroup: limits are per process ({per_process}; {limits.processes} processes for this user).")

    if not f["ripgrep"]["version"]:
        meaning.append("no ripgrep: the Grep tool falls back to grep -rE (slower, fewer file types).")
    if f["docker"]["engine"]:
        meaning.append(f"docker engine {f['docker']['engine']} is reachable; this build's sandbox backend is 'local' (bubblewrap).")
    return meaning, missing


def _render_doctor(f: dict[str, Any], meaning: list[str], missing: list[str]) -> None:
    def mark(ok: bool | None) -> str:
        return "[green]✓[/]" if ok else ("[yellow]–[/]" if ok is None else "[red]✗[/]")

    torch = f["torch"]
    gpus = torch.get("gpus") or []
    rows = [
        ("python", f["python"]["ok"], f"{f['python']['version']} ({f['python']['executable']})"),
        ("torch", bool(torch.get("version")), torch.get("version") or torch.get("error", "")),
        ("GPU", bool(gpus) or None, ", ".join(gpus) if gpus else f"none visible to torch (CUDA build: {torch.get('cuda_build') or 'no'})"),
        ("nvidia-smi", bool(f["nvidia_smi"]["gpus"]) or None, "; ".join(f["nvidia_smi"]["gpus"]) or ("present, no GPU listed" if f["nvidia_smi"]["present"] else "not installed")),
        ("nvcc", bool(f["nvcc"]["version"]) or None, f"{f['nvcc']['version']} ({f['nvcc']['path']})" if f["nvcc"]["version"] else "not found"),
        ("triton", bool(f["triton"]["version"]) or None, f["triton"]["version"] or "not installed"),
        ("g++", bool(f["g++"]["version"]), f["g++"]["version"] or "not found"),
        ("ninja", bool(f["ninja"]["version"]), f["ninja"]["version"] or "not found"),
        ("bubblewrap", f["bubblewrap"]["works"], f"{f['bubblewrap']['version']}, works" if f["bubblewrap"]["works"] else (f["bubblewrap"]["problem"] or "")),
        ("cgroup", f["cgroup"]["available"] or None, f"{f['cgroup']['version']}, sandboxes get one" if f["cgroup"]["available"] else "cannot create one here"),
        ("ripgrep", bool(f["ripgrep"]["version"]) or None, f["ripgrep"]["version"] or "not found"),
        ("docker", bool(f["docker"]["engine"]) or None, f"engine {f['docker']['engine']}" if f["docker"]["engine"] else (f"{f['docker']['client']} (client only, no engine reachable)" if f["docker"]["client"] else "not installed")),
        ("running as", None if f["root"] else True, "root" if f["root"] else f"uid {os.geteuid()}"),
    ]
    table = Table(show_header=False, show_edge=False, box=None, padding=(0, 1))
    for name, ok, detail in rows:
        table.add_row(mark(ok), name, escape(str(detail)))
    out.print(table)
    out.print()
    out.print("[bold]What this means[/]")
    notes = Table.grid(padding=(0, 1))
    for line in meaning:
        notes.add_row(" •", escape(line))
    for line in missing:
        notes.add_row(" [red]✗[/]", f"[red]missing: {escape(line)}[/]")
    out.print(notes)


# ============================================================================= run-task


@app.command("run-task")
def run_task(
    task: str = typer.Argument(..., help="example/relu_add, a task .py, FILE.jsonl#ID, or kernelbench/L<level>/<id>."),
    language: LanguageName = typer.Option(LanguageName(DEFAULT_LANGUAGE), "--language", "-l", help="What the kernels are written in."),
    sandbox: SandboxKind = typer.Option(SandboxKind(DEFAULT_SANDBOX), "--sandbox", help="Sandbox backend."),
    keep: bool = typer.Option(True, "--keep/--no-keep", help="Keep the workspace when the shell exits (default: keep, "
                                                              "so what you wrote survives; its path is printed)."),
    kernelbench: Path | None = typer.Option(None, "--kernelbench", help="KernelBench checkout for kernelbench/L<level>/<id> "
                                                                        "tasks (default: $KERNEL_ENV_KERNELBENCH)."),
    # Solution mode: see the section "run-task --solution" below.
    solution: Path | None = typer.Option(None, "--solution", help="Run this solution folder (model_new.py, kernels/) "
                                                                   "through compile → verify → profile instead of opening a shell."),
    device: Device | None = typer.Option(None, "--device", help="Where verification and profiling run (default: cuda if "
                                                                "there is a GPU, else cpu)."),
    as_json: bool = typer.Option(False, "--json", help="Solution mode: print the result as JSON."),
) -> None:
    """Work on one task in its sandboxed workspace: an interactive shell, or (--solution DIR) run a solution."""
    if solution is not None:
        code = _run_solution(task, solution=solution, language=language.value, sandbox=sandbox.value, device=device,
                             as_json=as_json, keep=keep, kernelbench=kernelbench)
        raise typer.Exit(code)
    if as_json:
        _fail("--json belongs to solution mode: add --solution DIR")
    raise typer.Exit(_run_interactive(task, language=language.value, sandbox_kind=sandbox.value, keep=keep,
                                      kernelbench=kernelbench, device=device.value if device else None))


def _resolve(task: str, kernelbench: Path | None) -> Task:
    try:
        return resolve_task(task, kernelbench_root=kernelbench)
    except TaskError as exc:
        _fail(str(exc))


def _commands(language: str) -> list[tuple[str, str]]:
    lang = get_language(language)
    compile_cmd = "TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh" if lang.needs_cuda else "bash utils/compile.sh"
    return [
        ("compile", compile_cmd + ("" if lang.builds_extension else "   (checks model_new.py and kernels/*.py)")),
        ("verify", "python3 -m utils.verification"),
        ("profile", "python3 -m utils.profiling"),
    ]


def _run_interactive(spec: str, *, language: str, sandbox_kind: str, keep: bool, kernelbench: Path | None,
                     device: str | None) -> int:
    task = _resolve(spec, kernelbench)
    if not sys.stdin.isatty():
        _fail("run-task opens an interactive shell and needs a terminal, but stdin is not one. Run it from a terminal, "
              "or pass --solution DIR to run a solution without one.")
    from kernel_env.sandbox.limits import Cgroup
    from kernel_env.sandbox.seccomp import no_terminal_injection_filter

    episode, workspace, box, note = _open_episode(task, language=language, sandbox_kind=sandbox_kind, device=device)
    isolated = getattr(box, "isolated", True)
    lines = [
        f"[bold]task[/]       {escape(task.id)}  ({escape(task.name)}, hash {task.hash})",
        f"[bold]language[/]   {language}",
        f"[bold]workspace[/]  {escape(str(workspace.path))}  (inside the sandbox: {box.workdir})",
        f"[bold]sandbox[/]    {sandbox_kind}: " + ("bubblewrap, no network, protected files read-only" if isolated
                                                 else "[red]NOT ISOLATED[/] (see `kernel-env doctor`)"),
        "",
        "Read SKILL.md first. Your files: model_new.py and kernels/. Commands:",
        *[f"  {label:<8} [cyan]{escape(cmd)}[/]" for label, cmd in _commands(language)],
        "",
        "Leave with [bold]exit[/] or Ctrl-D." + (" The workspace is kept." if keep else " The workspace is deleted then (--no-keep)."),
        *([f"[yellow]note:[/] {escape(note)}"] if note else []),
    ]
    err.print(Panel("\n".join(lines), title="kernel-env run-task", expand=False))

    group = Cgroup.create(box.limits) if hasattr(box, "limits") else None

    def in_child() -> None:  # the person's shell: the sandbox's limits, and Ctrl-C for the shell, not for us
        if group is not None:
            group.enter()
        if hasattr(box, "limits"):
            box.limits.apply_rlimits()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    argv, seccomp_fd = box.interactive_argv(), None
    if isolated:
        # The shell shares this terminal (job control needs it): block TIOCSTI, so nothing run in
        # there can type commands into the terminal for the host shell to run after it exits.
        program = no_terminal_injection_filter()
        if program is None:
            err.print("[yellow]note:[/] no seccomp filter for this architecture: code run in this shell could type "
                      "into your terminal (TIOCSTI) where the kernel allows it")
        else:
            seccomp_fd, write_end = os.pipe()
            os.write(write_end, program)
            os.close(write_end)
            argv = [argv[0], "--seccomp", str(seccomp_fd), *argv[1:]]

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        env = None if isolated else {**os.environ, "PS1": r"[kernel-env \W]\$ "}
        subprocess.run(argv, cwd=workspace.path, env=env, preexec_fn=in_child,
                       pass_fds=(seccomp_fd,) if seccomp_fd is not None else ())
    finally:
        signal.signal(signal.SIGINT, previous)
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if episode is not None:
            episode.close(keep_workspace=True)
        else:
            box.close()
        if group is not None:
            group.destroy()
        if keep:
            tampered = workspace.tampered_files()
            if tampered:
                err.print(f"[yellow]note:[/] protected files changed: {', '.join(tampered)}")
            err.print(f"workspace kept: {escape(str(workspace.path))}\n"
                      f"  remove it with: chmod -R u+w {escape(str(workspace.root))} && rm -rf {escape(str(workspace.root))}")
        else:
            workspace.destroy()
    return EXIT_OK


def _open_episode(task: Task, *, language: str, sandbox_kind: str, device: str | None):
    """(episode or None, workspace, sandbox, note): the agent's episode set-up, broker included, so that
    utils.verification and utils.profiling work in the shell. Where the language cannot be evaluated here
    (cuda without a GPU, and no --device asked for), a workspace and sandbox without evaluation, and a note."""
    from kernel_env.episode import Episode, EpisodeError
    from kernel_env.sandbox import SandboxError, make_sandbox
    from kernel_env.workspace import Workspace

    try:
        episode = Episode.open(task, language=language, device=device, sandbox=sandbox_kind)
        return episode, episode.workspace, episode.sandbox, None
    except EpisodeError as exc:
        if device is not None:
            _fail(f"task {task.id}: {exc}")
        note = f"{exc}. This shell can edit and compile, but verification and profiling cannot run here."
    except SandboxError as exc:
        _fail(f"task {task.id}: {exc}")
    except OSError as exc:
        _fail(f"task {task.id}: cannot set up the workspace under {workspaces_dir()}: {exc}")
    try:
        workspace = Workspace.create(task, language)
    except OSError as exc:
        _fail(f"cannot create a workspace for {task.id} under {workspaces_dir()}: {exc}")
    try:
        box = make_sandbox(sandbox_kind, workspace)
        box.start()
    except SandboxError as exc:
        workspace.destroy()
        _fail(f"task {task.id}: {exc}")
    return None, workspace, box, note


# ============================================================================= run-task --solution
# Solution mode: copy DIR (model_new.py, kernels/…) into a fresh workspace and run the same
# compile → verify → profile path an agent uses, in the sandbox, then the trusted final
# evaluation. The last line of --json output is one JSON object (EvalResult.summary()).


def _run_solution(spec: str, *, solution: Path, language: str, sandbox: str, device: Device | None, as_json: bool,
                  keep: bool, kernelbench: Path | None) -> int:
    from kernel_env.episode import Episode, EpisodeError
    from kernel_env.evaluators.records import Mode
    from kernel_env.evaluators.report import model_report
    from kernel_env.sandbox import SandboxError

    task = _resolve(spec, kernelbench)
    if not (solution / "model_new.py").is_file():
        _fail(f"solution {solution}: no model_new.py there (a solution folder holds model_new.py and kernels/)")
    quiet = as_json or not err.is_terminal
    try:
        with err.status(f"{task.id}: setting up the workspace and sandbox…") as status:
            episode = Episode.open(task, language=language, device=device.value if device else None, sandbox=sandbox)
            try:
                copied = episode.workspace.copy_solution(solution)
                status.update(f"{task.id}: building ({len(copied)} files), then verifying and timing on the {episode.device.upper()} pool…")
                build, result = episode.build_and_evaluate(Mode.FINAL)
            finally:
                episode.close(keep_workspace=False)
    except (EpisodeError, SandboxError) as exc:
        _fail(f"task {task.id}: {exc}")
    if as_json:
        # One object on one line: the contract is that the last line of output is the result.
        sys.stdout.write(json.dumps({**result.summary(), "build_ok": build.ok, "build_seconds": build.duration_s}) + "\n")
    else:
        if not quiet:
            out.print(escape(build.output.strip()[-2000:]) if not build.ok else f"[dim]build: {escape(build.output.strip().splitlines()[-1] if build.output.strip() else 'ok')}[/]")
        out.print(escape(model_report(result)))
        _render_result_table(result)
    return EXIT_OK if result.correct else EXIT_TASK_FAILED


def _render_result_table(result) -> None:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.4f}"

    def x(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}x"

    table = Table(title=f"{escape(result.task_id)} ({result.language}, {escape(result.device_name or result.device)})")
    for column in ("correct", "reward", "ModelNew ms", "eager ms", "compile ms", "vs eager", "vs compile"):
        table.add_column(column, justify="right")
    table.add_row("yes" if result.correct else "[red]no[/]", f"{result.reward:g}" if result.reward is not None else "—",
                  ms(result.runtime_ms), ms(result.eager_ms), ms(result.compile_ms), x(result.speedup_vs_eager), x(result.speedup_vs_compile))
    out.print(table)


# ============================================================================= generate
# `kernel-env generate`: the fixed multi-turn refine loop against an OpenAI-compatible server.


# ============================================================================= eval and report
# `kernel-env eval`: KernelAgent-v0 episodes with a tool-calling model over a task set; `kernel-env report`.


if __name__ == "__main__":
    app()
