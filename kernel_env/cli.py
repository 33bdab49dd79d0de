"""The ``kernel-env`` command line: ``tasks``, ``doctor``, ``run-task``.

It renders what the library computes, for people (rich) and for machines (``--json``), and
decides nothing the library does not. Exit codes mean the same everywhere:

    0  ok
    1  the task failed (a malformed task, a solution that does not build or is wrong)
    2  usage or environment error (bad arguments, no terminal, a missing tool)

Progress and errors go to stderr, results to stdout, so ``--json`` output can be piped.
"""

from __future__ import annotations

import asyncio
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
SandboxKind = enum.Enum("SandboxKind", {"local": "local", "docker": "docker"}, type=str)


class Device(str, enum.Enum):
    cuda = "cuda"
    cpu = "cpu"


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


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
    source: str = typer.Argument(..., help="'examples', a task .py file, a .jsonl/.json/.parquet file of task records "
                                           "(KernelBench export, KernelBook, CUDA-Agent-Ops-6K, `kernel-env synth` output), "
                                           "a KernelBench checkout, or a folder of record files."),
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


@app.command()
def headers(
    language: list[str] = typer.Argument(None, help="cpp and/or cuda (default: both; cuda needs nvcc)."),
) -> None:
    """Precompile torch's headers for workspace builds with this host's toolchain (about half of a
    binding source's compile time). Sandboxes also do this in the background on first use."""
    from kernel_env import headers as precompiled

    failed = False
    for name in language or list(precompiled.LANGUAGES):
        if name not in precompiled.LANGUAGES:
            _fail(f"no headers to precompile for {name!r}; choose from {', '.join(precompiled.LANGUAGES)}")
        with err.status(f"precompiling torch headers for {name} workspaces (about half a minute)"):
            proc = precompiled.precompile(name)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        out.print(f"{name}: {escape(lines[-1] if lines else f'exit status {proc.returncode}')}", soft_wrap=True)
        failed |= proc.returncode != 0
    raise typer.Exit(EXIT_TASK_FAILED if failed else EXIT_OK)


def _load_source(source: str) -> list[Task]:
    if source not in ("examples", "example") and not Path(source).expanduser().exists():
        _fail(f"task source {source}: no such file or folder (give 'examples', a .py, a .jsonl/.json/.parquet, "
              "a KernelBench checkout or a folder of record files)")
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

    facts["evaluation_children"] = _evaluation_children()

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


def _evaluation_children() -> dict[str, Any]:
    """Whether an evaluation child can be forked and answer here (its fork server started, isolated or not)."""
    from kernel_env.evaluators.isolation import Child, ChildError

    try:
        child = Child.spawn("reference", env={"CUDA_VISIBLE_DEVICES": ""}, gpu=False, label="doctor")
        try:
            answer, _ = child.call("setup", 120, device="cpu", out_dir=child.path("/job/ref"), task_code="")
        finally:
            child.discard()
    except (ChildError, OSError) as exc:
        return {"works": False, "isolated": None, "problem": str(exc).splitlines()[0]}
    if not answer.get("ok"):
        return {"works": False, "isolated": child.isolated, "problem": str(answer.get("error"))}
    return {"works": True, "isolated": child.isolated, "problem": None}


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
    children = f["evaluation_children"]
    if not children["works"]:
        missing.append(f"evaluation children: {children['problem']}")
    elif not children["isolated"]:
        meaning.append("evaluation children (the trusted harness's reference and candidate processes) are NOT "
                       "isolated without bubblewrap: do not evaluate untrusted solutions here.")
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
        meaning.append(f"docker engine {f['docker']['engine']} is reachable: the docker sandbox backend can run here (--sandbox docker).")
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
        ("evaluation", f["evaluation_children"]["works"], ("children fork and answer" + ("" if f["evaluation_children"]["isolated"] else ", NOT isolated"))
         if f["evaluation_children"]["works"] else f["evaluation_children"]["problem"]),
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
        f"[bold]sandbox[/]    {sandbox_kind}: " + (("bubblewrap" if sandbox_kind == "local" else "a container")
                                                 + ", no network, protected files read-only" if isolated
                                                 else "[red]NOT ISOLATED[/] (see `kernel-env doctor`)"),
        "",
        "Read SKILL.md first. Your files: model_new.py and kernels/. Commands:",
        *[f"  {label:<8} [cyan]{escape(cmd)}[/]" for label, cmd in _commands(language)],
        "",
        "Leave with [bold]exit[/] or Ctrl-D." + (" The workspace is kept." if keep else " The workspace is deleted then (--no-keep)."),
        *([f"[yellow]note:[/] {escape(note)}"] if note else []),
    ]
    err.print(Panel("\n".join(lines), title="kernel-env run-task", expand=False))

    local = sandbox_kind == "local"  # a docker shell is `docker exec`: the container has the limits and its own terminal
    group = Cgroup.create(box.limits) if local else None

    def in_child() -> None:  # the person's shell: the sandbox's limits, and Ctrl-C for the shell, not for us
        if group is not None:
            group.enter()
        if local:
            box.limits.apply_rlimits()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    argv, seccomp_fd = box.interactive_argv(), None
    if isolated and local:
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


# ============================================================================= image
# `kernel-env image build cuda|cpu`: the images of sandbox_images/ for the docker sandbox and GPU
# workers (kernel_env/sandbox/images.py). The docker sandbox's default image needs no build.

image_app = typer.Typer(help="Container images for the docker sandbox and GPU workers (sandbox_images/).",
                        no_args_is_help=True)
app.add_typer(image_app, name="image")
ImageKind = enum.Enum("ImageKind", {"cuda": "cuda", "cpu": "cpu"}, type=str)


@image_app.command("build")
def image_build(
    kind: ImageKind = typer.Argument(..., help="cuda (CUDA devel base: sandboxes and GPU workers) or cpu."),
    tag: str | None = typer.Option(None, "--tag", help="Image tag (default: kernel_env/<kind>:<version>)."),
    base: str | None = typer.Option(None, "--base", help="Base image instead of the Dockerfile's (pulled if not here)."),
    torch: str | None = typer.Option(None, "--torch", help="pip requirement for torch instead of the pin (torch==2.13.0)."),
) -> None:
    """Build an image with the local Docker engine; prints its tag. Use it with DockerSandbox(image=TAG)."""
    from kernel_env.sandbox.images import ImageBuildError, build_image

    try:
        built = build_image(kind.value, tag=tag, base=base, torch_spec=torch,
                            on_line=lambda line: err.print(escape(line), soft_wrap=True))
    except ImageBuildError as exc:
        _fail(str(exc))
    out.print(built)


# ============================================================================= synth
# `kernel-env synth`: a task set made like CUDA-Agent-Ops-6K (kernel_env/synth/: crawl → compose →
# decontaminate → filter), resumable: rerun the same command to go on where it stopped.
# `synth seeds` lists the crawl, `synth stats SOURCE` prints Table 3 of any task set, `synth
# decontam SOURCE` checks one against an evaluation set. Exit codes: 0 the output holds --count
# tasks; 1 fewer (--max-candidates ran out first); 2 usage or environment error; 130 interrupted
# (the output so far is written: rerun to resume).

synth_app = typer.Typer(help="Synthesise training tasks (CUDA-Agent-Ops-6K pipeline): compose torch operators, "
                             "decontaminate, filter in isolated processes. Subcommands inspect the stages.")
app.add_typer(synth_app, name="synth")
ComposerName = enum.Enum("ComposerName", {"deterministic": "deterministic", "llm": "llm"}, type=str)
SizeName = enum.Enum("SizeName", {"realistic": "realistic", "small": "small"}, type=str)


def _op_weights(text: str | None) -> dict[int, float] | None:
    if text is None:
        return None
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
        from kernel_env.synth.compose import check_weights

        return check_weights({count: weight for count, weight in enumerate(values, 1)})
    except ValueError as exc:
        _fail(f"--op-weights {text!r}: {exc} (give up to 5 comma-separated weights for 1, 2, … 5 operators)")


def _eval_set(spec: str | None) -> tuple[list[Task], str, str | None]:
    """The decontamination set: --eval-set, else $KERNEL_ENV_KERNELBENCH, else the bundled examples (with a note)."""
    note = None
    if spec is None:
        spec = os.environ.get("KERNEL_ENV_KERNELBENCH")
        if not spec:
            spec = "examples"
            note = ("decontaminated against the bundled examples only: pass --eval-set KernelBench/ (or set "
                    "KERNEL_ENV_KERNELBENCH) for the real check")
    if spec == "none":
        return [], "none", "decontamination is off (--eval-set none)"
    return _load_source(spec), spec, note


@synth_app.callback(invoke_without_command=True)
def synth(
    ctx: typer.Context,
    composer: ComposerName = typer.Option(ComposerName("deterministic"), "--composer",
                                          help="deterministic (shape-checked chaining, no model) or llm (--base-url)."),
    count: int = typer.Option(100, "--count", min=1, help="Tasks to keep (the output's size)."),
    out: Path = typer.Option(Path("synth_tasks.jsonl"), "--out", "-o", help="The task set: .jsonl or .parquet."),
    device: Device | None = typer.Option(None, "--device", help="Where the filter runs and times (default: cuda if there is a GPU)."),
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
    threshold: float = typer.Option(0.9, "--threshold", min=0.0, max=1.0, help="Drop candidates with AST similarity above this."),
    min_ms: float | None = typer.Option(None, "--min-ms", min=0.0, help="Eager time floor (default 1 ms on cuda; 50 ms on the CPU)."),
    max_ms: float | None = typer.Option(None, "--max-ms", min=0.0, help="Eager time ceiling (default 100 ms on cuda; 5000 ms on the CPU)."),
    timed_calls: int = typer.Option(10, "--timed-calls", min=1, help="Timed eager calls per candidate (median)."),
    op_weights: str | None = typer.Option(None, "--op-weights", help="Weights of 1,2,…,5-operator compositions "
                                                                     "(default the paper's mix: 3.4,83.77,7.62,2.8,1.23)."),
    no_transformers: bool = typer.Option(False, "--no-transformers", help="No transformers seeds even where installed."),
    ops: str | None = typer.Option(None, "--ops", help="Compose only these seed classes (comma-separated names, "
                                                       "e.g. Linear,Conv2d,ReLU; `kernel-env synth seeds` lists them)."),
    transformers_share: float = typer.Option(0.0118, "--transformers-share", min=0.0, max=1.0,
                                             help="Share of standalone transformers tasks (where installed)."),
    base_url: str = typer.Option("http://localhost:8000/v1", "--base-url", help="OpenAI-compatible server (--composer llm)."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the server's first)."),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="Sampling temperature (--composer llm)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Cap on each answer's tokens (--composer llm)."),
    compose_jobs: int = typer.Option(4, "--compose-jobs", min=1, help="Model requests in flight (--composer llm)."),
    work_dir: Path | None = typer.Option(None, "--work-dir", help="State folder (default: OUT.synth/)."),
    compile_cache: Path | None = typer.Option(None, "--compile-cache", help="torch.compile cache the filter's processes "
                                                                           "share (default: in the state folder)."),
    restart: bool = typer.Option(False, "--restart", help="Forget the state of an earlier run with this output."),
    as_json: bool = typer.Option(False, "--json", help="Print the run's summary as JSON."),
) -> None:
    """Make a task set: compose, decontaminate and filter candidates until --count are kept. Resumable."""
    if ctx.invoked_subcommand is not None:
        return
    from kernel_env.episode import default_device
    from kernel_env.synth.filter import FilterSettings
    from kernel_env.synth.compose import PAPER_OP_COUNT_WEIGHTS
    from kernel_env.synth.pipeline import SynthConfig, SynthError, run

    where = device.value if device else default_device()
    if out.suffix not in (".jsonl", ".parquet"):
        _fail(f"--out {out}: give a .jsonl or .parquet file")
    eval_tasks, eval_name, note = _eval_set(eval_set)
    settings = FilterSettings(device=where, min_ms=min_ms, max_ms=max_ms, timed_calls=timed_calls,
                              jobs_per_device=jobs or (4 if where == "cuda" else 1))
    config = SynthConfig(
        out=out, count=count, composer=composer.value, seed=seed, size=size.value,
        op_weights=_op_weights(op_weights) or dict(PAPER_OP_COUNT_WEIGHTS), transformers=not no_transformers,
        ops=[name.strip() for name in ops.split(",") if name.strip()] if ops else None,
        transformers_share=transformers_share, max_candidates=max_candidates, eval_tasks=eval_tasks,
        eval_name=eval_name, threshold=threshold, filter=settings, work_dir=work_dir, compile_cache=compile_cache,
        base_url=base_url, model=model,
        api_key=api_key, temperature=temperature, max_tokens=max_tokens, compose_jobs=compose_jobs)
    low, high = settings.bounds()
    if not as_json:
        err.print(f"synth: {count} tasks into {escape(str(out))} ({composer.value} composer, {config.size} sizes, "
                  f"filter on {where} within [{low:g}, {high:g}] ms, decontaminated against {escape(eval_name)}; "
                  f"state in {escape(str(config.state_dir))})", soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        bar = progress.add_task("kept", total=count)

        def report(p) -> None:
            progress.update(bar, completed=min(p.kept, count),
                            description=f"kept · {p.dropped} contaminated · {p.rejected} rejected · {p.screening} screening")
            if not err.is_terminal and not as_json:
                err.print(escape(p.event), soft_wrap=True)

        try:
            summary = run(config, restart=restart, on_progress=report, notes=[note] if note else [])
        except SynthError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] the tasks kept so far are in {escape(str(out))}; rerun the same "
                      "command to go on")
            raise typer.Exit(130) from None
    if as_json:
        _print_json(summary.to_record())
    else:
        _render_synth_summary(summary)
    raise typer.Exit(EXIT_OK if summary.complete else EXIT_TASK_FAILED)


def _render_synth_summary(summary) -> None:
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


@synth_app.command("stats")
def synth_stats(
    source: str = typer.Argument(..., help="Any `tasks` source: synth output, Ops-6K parquet, ..."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The share of 1- … 5-operator compositions and transformers tasks in a task set (Table 3)."""
    from kernel_env.synth.stats import composition_stats

    stats = composition_stats(_load_source(source))
    if as_json:
        _print_json(stats.to_record())
    else:
        _render_stats(stats)


@synth_app.command("seeds")
def synth_seeds(
    output: Path | None = typer.Option(None, "--out", "-o", help="Also write each seed as a one-operator task (.jsonl/.parquet)."),
    size: SizeName = typer.Option(SizeName("realistic"), "--size", help="Input sizes of the written tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed of the written tasks' sizes."),
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Leave transformers out."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The crawl: which torch.nn (and transformers) classes are seeds, and why the others are not."""
    import random as _random

    from kernel_env.synth.compose import seed_task
    from kernel_env.synth.crawl import PRESETS, crawl
    from kernel_env.task_sources import write_records

    found = crawl(transformers=not no_transformers)
    if output is not None:
        rng = _random.Random(seed)
        written = []
        for s in found.seeds:
            code = seed_task(s, PRESETS[size.value], rng)
            if code:
                written.append(Task(id=f"seed/{s.library}/{s.name}", code=code, source="synthetic", name=s.name,
                                    metadata={"ops": [s.name], "data_source": f"{s.library}#1"}))
        write_records(written, output)
    seeds = [{"name": s.name, "module": s.module, "kind": s.kind, "ranks": list(s.ranks)} for s in found.seeds]
    if as_json:
        _print_json({"seeds": seeds, "skipped": found.skipped, "notes": found.notes})
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("seed", "module", "kind", "input ranks"):
        table.add_column(column)
    for s in seeds:
        table.add_row(s["name"], s["module"], s["kind"], ",".join(map(str, s["ranks"])))
    out.print(table)
    reasons: dict[str, int] = {}
    for reason in found.skipped.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    out.print(f"{len(seeds)} seeds; {len(found.skipped)} classes skipped: "
              + "; ".join(f"{n} {escape(r)}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])))
    for line in found.notes:
        out.print(f"[yellow]note:[/] {escape(line)}", soft_wrap=True)


@synth_app.command("decontam")
def synth_decontam(
    source: str = typer.Argument(..., help="The task set to check (any `tasks` source)."),
    eval_set: str = typer.Option(..., "--eval-set", help="The evaluation set (any `tasks` source, e.g. a KernelBench checkout)."),
    threshold: float = typer.Option(0.9, "--threshold", min=0.0, max=1.0, help="Drop tasks with AST similarity above this."),
    out_dir: Path = typer.Option(Path("decontam"), "--out-dir", help="Where kept.jsonl, dropped.jsonl and similarity.png go."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Decontaminate a task set: kept.jsonl, dropped.jsonl and the similarity histogram in --out-dir."""
    from kernel_env.synth.decontam import decontaminate, write_dropped, write_histogram
    from kernel_env.task_sources import write_records

    tasks = _load_source(source)
    report = decontaminate(tasks, _load_source(eval_set), threshold=threshold)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept_ids = report.kept_ids()
    write_records([t for t in tasks if t.id in kept_ids], out_dir / "kept.jsonl")
    write_dropped(report.dropped, out_dir / "dropped.jsonl")
    why_not = write_histogram([m.similarity for m in report.matches], threshold, out_dir / "similarity.png",
                              title=f"{source} vs {eval_set}")
    record = {"tasks": len(tasks), "kept": len(kept_ids), "dropped": [m.to_record() for m in report.dropped],
              "histogram": None if why_not else str(out_dir / "similarity.png"), "note": why_not}
    if as_json:
        _print_json(record)
        return
    for match in report.dropped:
        out.print(f"dropped {escape(match.task_id)}: similarity {match.similarity:.3f} to {escape(str(match.nearest))}")
    out.print(f"{len(kept_ids)} of {len(tasks)} tasks kept ({escape(str(out_dir / 'kept.jsonl'))}); "
              f"histogram: {escape(record['histogram'] or why_not or '')}")


# ============================================================================= generate
# `kernel-env generate`: the fixed multi-turn refine loop against an OpenAI-compatible server.
# Exit codes: 0 every selected sample has a trace in the output (a wrong or slow kernel is data,
# not a failure); 1 some samples ended without one (their model calls failed: rerun to retry
# them); 2 usage or environment error (no source, unreadable output, server unreachable, no
# sandbox); 130 interrupted (every finished trace is kept: rerun to resume).


@app.command()
def generate(
    base_url: str = typer.Option("http://localhost:8000/v1", "--base-url", help="OpenAI-compatible server (vLLM, SGLang)."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the server's only model)."),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="Feedback rounds: answer errors, mismatches and slow "
                                                                "kernels until success or --max-turns."),
    max_turns: int = typer.Option(4, "--max-turns", min=1, help="Answers per sample at most, with --multi-turn."),
    batch_size: int = typer.Option(10, "--batch-size", min=1, help="Generations in flight at once."),
    output: Path = typer.Option(Path("reasoning_traces.json"), "--output", "-o",
                                help="Traces (a JSON list). Rerunning with the same file skips finished samples."),
    kernelbench: Path | None = typer.Option(None, "--kernelbench", help="A KernelBench checkout (level1/ …)."),
    kernelbook: Path | None = typer.Option(None, "--kernelbook", help="A JSONL file of KernelBook task records."),
    tasks_spec: str | None = typer.Option(None, "--tasks", help="More tasks: 'examples', a .py, a .jsonl or a "
                                                                 "KernelBench checkout (all of them)."),
    kernelbench_samples: int = typer.Option(1000, "--kernelbench-samples", min=0, help="At most this many KernelBench problems."),
    kernelbook_samples: int = typer.Option(1500, "--kernelbook-samples", min=0, help="At most this many KernelBook records."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random sample of a capped source."),
    language: LanguageName = typer.Option(LanguageName("triton"), "--language", "-l", help="What the kernels are written in."),
    device: Device | None = typer.Option(None, "--device", help="Where answers are evaluated (default: cuda if there is a GPU)."),
    sandbox: SandboxKind = typer.Option(SandboxKind(DEFAULT_SANDBOX), "--sandbox", help="Sandbox backend."),
    pool: str = typer.Option("local", "--pool", help="Evaluation pool: local (this machine's GPUs, or its CPU) "
                                                     "or ray (a Ray cluster: ray.init's default address)."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="Sampling temperature."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Cap on each completion's tokens (default: the server's)."),
    request_timeout: float = typer.Option(900.0, "--request-timeout", min=1.0, help="Seconds one generation may take."),
    max_active: int | None = typer.Option(None, "--max-active", min=1, help="Samples in the line at once, each with its "
                                                                            "workspace (default: 4 × --batch-size)."),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one."),
    as_json: bool = typer.Option(False, "--json", help="Print the run's summary as JSON."),
) -> None:
    """Generate refine-loop traces (SFT data) with a model behind an OpenAI-compatible server."""
    from kernel_env.generate import GenerateConfig, GenerateError, TraceStore, generate as run_generate, select_tasks

    if kernelbench is None and kernelbook is None and tasks_spec is None:
        _fail("no samples: give --kernelbench DIR, --kernelbook FILE.jsonl and/or --tasks SPEC")
    if pool not in ("local", "ray"):
        _fail(f"unknown --pool {pool!r}; choose local or ray")
    try:
        selected = select_tasks(kernelbench=kernelbench, kernelbook=kernelbook, tasks=tasks_spec,
                                kernelbench_samples=kernelbench_samples, kernelbook_samples=kernelbook_samples, seed=seed)
    except TaskError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot read the samples: {exc}")
    config = GenerateConfig(base_url=base_url, model=model, api_key=api_key, multi_turn=multi_turn, max_turns=max_turns,
                            batch_size=batch_size, max_active=max_active, language=language.value,
                            device=device.value if device else None, sandbox=sandbox.value, pool=pool,
                            temperature=temperature,
                            max_tokens=max_tokens, request_timeout=request_timeout)
    store = TraceStore(output)
    try:
        store.open()
    except (GenerateError, OSError) as exc:
        _fail(str(exc))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        bar = progress.add_task("generating", total=sum(task.id not in store.finished for task in selected))

        def report(summary, waiting: int, event: str) -> None:
            progress.update(bar, total=summary.to_do, completed=summary.written + len(summary.failed),
                            description=f"{summary.success_fast} fast · {summary.max_turns_reached} max turns · "
                                        f"{len(summary.failed)} failed · {waiting} in line")
            if not err.is_terminal and not as_json:
                err.print(escape(event), soft_wrap=True)

        try:
            summary = run_interruptibly(run_generate(selected, config, store, on_progress=report))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] {len(store.traces)} traces are in {escape(str(output))}; "
                      "rerun the same command to go on")
            raise typer.Exit(130) from None
        except GenerateError as exc:
            _fail(f"{exc} ({len(store.traces)} traces are in {output})")
    result = {"output": str(output), "model": summary.model, "selected": summary.selected, "skipped": summary.skipped,
              "written": summary.written, "success_fast": summary.success_fast,
              "max_turns_reached": summary.max_turns_reached, "failed": summary.failed}
    if as_json:
        _print_json(result)
    else:
        out.print(f"{summary.written} new traces in {escape(str(output))} ({summary.success_fast} success_fast, "
                  f"{summary.max_turns_reached} max_turns_reached); {summary.skipped} samples were already there; "
                  f"model {escape(summary.model)}")
        for key, why in summary.failed.items():
            out.print(f"[red]✗[/] {escape(key)}: {escape(why)} (a rerun tries it again)", soft_wrap=True)
    raise typer.Exit(EXIT_TASK_FAILED if summary.failed else EXIT_OK)


# ============================================================================= eval and report
# `kernel-env eval`: KernelAgent-v0 episodes with a tool-calling model over a task set; `kernel-env report`.
# eval's exit codes: 0 every selected task has an episode record that did not end in error; 1 some
# episodes ended in error (the model's calls failed: rerun to retry them); 2 usage or environment
# error (bad source, bad settings, an output that is not a run file, server unreachable); 130
# interrupted (every finished record is kept: rerun to resume).


@app.command("eval")
def eval_command(
    source: str = typer.Argument(..., help="'examples', a task .py file, a .jsonl of task records, a KernelBench "
                                           "checkout, or one task's id (example/relu_add)."),
    level: int | None = typer.Option(None, "--level", help="Only tasks of this level."),
    name: str | None = typer.Option(None, "--name", help="Only tasks whose id or name contains this (case-insensitive)."),
    count: int | None = typer.Option(None, "--count", min=1, help="At most this many tasks (after the other filters)."),
    sample: int | None = typer.Option(None, "--sample", min=1, help="A random sample of this many tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the server's only model)."),
    base_url: str = typer.Option("http://localhost:8000/v1", "--base-url", help="OpenAI-compatible server with tool "
                                                                                 "calling (vLLM, SGLang, OpenAI)."),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one."),
    language: LanguageName | None = typer.Option(None, "--language", "-l", help="What the kernels are written in "
                                                                                  "(default: cuda with a GPU, else cpp)."),
    device: Device | None = typer.Option(None, "--device", help="Where solutions are evaluated (default: cuda if there is a GPU)."),
    sandbox: SandboxKind = typer.Option(SandboxKind(DEFAULT_SANDBOX), "--sandbox", help="Sandbox backend."),
    concurrency: int = typer.Option(8, "--concurrency", "-j", min=1, help="Episodes in flight at once."),
    max_turns: int = typer.Option(200, "--max-turns", min=1, help="Turns per episode (the paper evaluates with 200)."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (default: the server's)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Cap on each reply's tokens (default: the server's)."),
    request_timeout: float = typer.Option(900.0, "--request-timeout", min=1.0, help="Seconds one model call may take."),
    settings_json: str | None = typer.Option(None, "--settings", help="Evaluation protocol overrides as JSON, e.g. "
                                                                       "'{\"timed_calls\": 10, \"compile_baseline\": false}'."),
    output: Path = typer.Option(Path("run.jsonl"), "--output", "-o", help="Episode records (JSONL). Rerunning with the "
                                                                          "same file skips tasks already done."),
    plot: Path | None = typer.Option(None, "--plot", help="Save the speed-up distribution here (PNG; needs kernel_env[eval])."),
    markdown_path: Path | None = typer.Option(None, "--markdown", help="Write the metrics as markdown tables here ('-': stdout)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run's summary and metrics as JSON."),
) -> None:
    """Evaluate a tool-calling model as a KernelAgent-v0 agent over a task set: pass rate, faster rates, geomean speed-ups."""
    from kernel_env.agent_runner import AgentRunConfig, EvalRunError, run_agent_eval
    from kernel_env.episode import default_device

    _check_stdout(as_json, markdown_path)
    selected = _select(_eval_tasks(source), level=level, name=name, sample=sample, seed=seed, count=count)
    if not selected:
        _fail(f"task source {source}: no task matches the filters")
    done = {r.task_id for r in (_read_run(output) if output.is_file() else []) if r.stop != "error"}
    where = device.value if device else default_device()
    config = AgentRunConfig(base_url=base_url, model=model, api_key=api_key,
                            language=language.value if language else ("cuda" if where == "cuda" else "cpp"),
                            device=where, sandbox=sandbox.value, max_turns=max_turns, concurrency=concurrency,
                            temperature=temperature, max_tokens=max_tokens, request_timeout=request_timeout,
                            settings=_eval_settings(settings_json))
    quiet = as_json or not err.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=quiet) as progress:
        bar = progress.add_task(f"{len(selected)} tasks, {concurrency} at a time",
                                total=sum(task.id not in done for task in selected))

        def report_episode(record, summary) -> None:
            progress.update(bar, total=summary.to_do, completed=summary.written,
                            description=f"{summary.finished} finished · {summary.turn_limit} turn limit · "
                                        f"{len(summary.errors)} errors")
            if not as_json and not err.is_terminal:
                final = record.final or {}
                err.print(escape(f"{record.task_id}: {record.stop} after {record.turns} turns, reward "
                                 f"{record.reward if record.reward is not None else '—'}, correct {final.get('correct')}"
                                 + (f" ({record.error})" if record.error else "")), soft_wrap=True)

        try:
            summary = run_interruptibly(run_agent_eval(selected, config, output, on_record=report_episode))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] finished episodes are in {escape(str(output))}; rerun the same command to go on")
            raise typer.Exit(130) from None
        except EvalRunError as exc:
            _fail(str(exc))
    wanted = {task.id for task in selected}
    records = [record for record in _read_run(output) if record.task_id in wanted]
    _show_metrics(records, plot=plot, markdown_path=markdown_path, as_json=as_json,
                  extra={"output": str(output), "model": summary.model, "selected": summary.selected,
                         "skipped": summary.skipped, "finished": summary.finished, "turn_limit": summary.turn_limit,
                         "errors": summary.errors})
    if not as_json:
        err.print(f"{summary.written} new episode records in {escape(str(output))} ({summary.skipped} tasks were done "
                  f"already); model {escape(summary.model)}")
        for task_id, why in summary.errors.items():
            err.print(f"[red]✗[/] {escape(task_id)}: {escape(why)} (a rerun tries it again)", soft_wrap=True)
    raise typer.Exit(EXIT_TASK_FAILED if summary.errors else EXIT_OK)


@app.command()
def report(
    run: Path = typer.Argument(..., help="A run file written by `kernel-env eval` (JSONL episode records)."),
    plot: Path | None = typer.Option(None, "--plot", help="Save the speed-up distribution here (PNG; needs kernel_env[eval])."),
    markdown_path: Path | None = typer.Option(None, "--markdown", help="Write the metrics as markdown tables here ('-': stdout)."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
) -> None:
    """Rebuild an eval run's metrics tables (and plot) from its run file."""
    _check_stdout(as_json, markdown_path)
    records = _read_run(run)
    if not records:
        _fail(f"run file {run}: no episode records in it")
    _show_metrics(records, plot=plot, markdown_path=markdown_path, as_json=as_json, extra={"output": str(run)})
    raise typer.Exit(EXIT_OK)


def _eval_tasks(source: str) -> list[Task]:
    """The tasks of a source (as `kernel-env tasks` reads it), or the one task a spec names."""
    if source in ("examples", "example") or Path(source).expanduser().exists():
        return _load_source(source)
    try:
        return [resolve_task(source)]
    except TaskError as exc:
        _fail(f"{exc}; or one task's id, such as example/relu_add")


def _check_stdout(as_json: bool, markdown_path: Path | None) -> None:
    if as_json and str(markdown_path) == "-":
        _fail("--json and --markdown - would both write to stdout; give --markdown a file")


def _eval_settings(settings_json: str | None):
    """EvalSettings from --settings (JSON object of its fields), or None for the protocol's defaults."""
    from pydantic import ValidationError

    from kernel_env.evaluators.records import EvalSettings

    if settings_json is None:
        return None
    fields = ", ".join(EvalSettings.model_fields)
    try:
        given = json.loads(settings_json)
    except ValueError as exc:
        _fail(f"--settings: not JSON ({exc}); give an object like '{{\"timed_calls\": 10}}'")
    if not isinstance(given, dict):
        _fail(f"--settings: give a JSON object of protocol fields ({fields})")
    unknown = sorted(set(given) - set(EvalSettings.model_fields))
    if unknown:  # pydantic would drop them silently, and a typo would go unnoticed
        _fail(f"--settings: {', '.join(unknown)}: no such field (fields: {fields})")
    try:
        return EvalSettings.model_validate(given)
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = ".".join(str(part) for part in problem["loc"]) or "the value"
        _fail(f"--settings: {field}: {problem['msg']} (fields: {fields})")


def _read_run(path: Path) -> list:
    from kernel_env.metrics import RecordError, read_records

    try:
        return read_records(path)
    except RecordError as exc:
        _fail(str(exc))


def _show_metrics(records: list, *, plot: Path | None, markdown_path: Path | None, as_json: bool,
                  extra: dict[str, Any]) -> None:
    """The metrics of ``records``: rich tables (or JSON) on stdout, markdown and the plot where asked."""
    from kernel_env.eval_report import PlotUnavailable, describe, markdown, plot_speedups, rich_tables
    from kernel_env.metrics import compute_metrics

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
                _fail(f"--markdown {markdown_path}: {exc.strerror or exc}")
            notes["markdown"] = str(markdown_path)
    if plot is not None:
        try:
            notes["plot"] = str(plot_speedups(records, plot, title=title))
        except PlotUnavailable as exc:
            notes["plot_skipped"] = str(exc)
        except OSError as exc:
            _fail(f"--plot {plot}: {exc.strerror or exc}")
    if as_json:
        _print_json({**extra, "title": title, "metrics": metrics.to_dict(), **notes})
        return
    if str(markdown_path) != "-":
        # Piped output gets room for the whole table (rich would squeeze it into 80 columns).
        console = out if out.is_terminal else Console(highlight=False, width=max(out.width, 110))
        for table in rich_tables(metrics, title=title):
            console.print(table)
    for what in ("markdown", "plot"):
        if what in notes:
            err.print(f"{what}: {escape(notes[what])}")
    if "plot_skipped" in notes:
        err.print(f"[yellow]note:[/] plot skipped: {escape(notes['plot_skipped'])}")


# ============================================================================= openhands
# `kernel-env openhands TASK`: an OpenHands agent (the optional extra kernel_env[openhands]) works on
# the task with kernel_env's tools in its sandbox; the episode ends with KernelAgent-v0's trusted final
# evaluation. Writes events.json, messages.json, result.json (EvalResult.summary() and the episode's
# ending) and report.txt to --output. Exit codes: 0 the final solution is correct; 1 it is not; 2 usage
# or environment error (the extra missing, bad settings, no sandbox, the conversation failed: the model
# server unreachable, say; the final evaluation of what was there is still written).


@app.command("openhands")
def openhands_command(
    task: str = typer.Argument(..., help="example/relu_add, a task .py, FILE.jsonl#ID, or kernelbench/L<level>/<id>."),
    model: str = typer.Option(..., "--model", help="The model as the server names it; without a litellm provider "
                                                   "prefix, 'openai/' is added (an OpenAI-compatible server)."),
    base_url: str = typer.Option("http://localhost:8000/v1", "--base-url", help="OpenAI-compatible server with tool "
                                                                                 "calling (vLLM, SGLang, OpenAI)."),
    api_key: str = typer.Option("EMPTY", "--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one."),
    language: LanguageName | None = typer.Option(None, "--language", "-l", help="What the kernels are written in "
                                                                                  "(default: cuda with a GPU, else cpp)."),
    device: Device | None = typer.Option(None, "--device", help="Where solutions are evaluated (default: cuda if there is a GPU)."),
    sandbox: SandboxKind = typer.Option(SandboxKind(DEFAULT_SANDBOX), "--sandbox", help="Sandbox backend."),
    max_iterations: int = typer.Option(150, "--max-iterations", min=1, help="Agent steps (model calls) at most."),
    output: Path = typer.Option(Path("openhands_run"), "--output", "-o", help="Directory for the conversation and the result."),
    settings_json: str | None = typer.Option(None, "--settings", help="Evaluation protocol overrides as JSON, e.g. "
                                                                       "'{\"timed_calls\": 10, \"compile_baseline\": false}'."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (default: the server's)."),
    request_timeout: int = typer.Option(900, "--request-timeout", min=1, help="Seconds one model call may take."),
    kernelbench: Path | None = typer.Option(None, "--kernelbench", help="KernelBench checkout for kernelbench/L<level>/<id> "
                                                                        "tasks (default: $KERNEL_ENV_KERNELBENCH)."),
    as_json: bool = typer.Option(False, "--json", help="Print result.json's record instead of the report."),
) -> None:
    """Run an OpenHands agent on one task in its sandbox; write the conversation and the trusted final result."""
    from kernel_env.episode import EpisodeError
    from kernel_env.evaluators.records import EvalSettings
    from kernel_env.evaluators.report import model_report
    from kernel_env.sandbox import SandboxError

    os.environ.setdefault("LOG_LEVEL", "ERROR")  # OpenHands' log would bury the report (set LOG_LEVEL to see it)
    try:
        from kernel_env.integrations.openhands import run_openhands  # first: it sets litellm's environment defaults
        from openhands.sdk import LLM
        from pydantic import SecretStr
    except ModuleNotFoundError as exc:
        _fail(f"the OpenHands plug-in needs its extra ({exc.name or exc} is missing): pip install 'kernel_env[openhands]'")
    try:
        settings = EvalSettings.model_validate_json(settings_json) if settings_json else None
    except ValueError as exc:
        _fail(f"--settings: {exc}")
    spec = _resolve(task, kernelbench)
    llm = LLM(model=_openhands_model(model), base_url=base_url, api_key=SecretStr(api_key), usage_id="kernel-env",
              temperature=temperature, timeout=request_timeout, num_retries=2)
    try:
        run = run_openhands(spec, llm, language=language.value if language else None,
                            device=device.value if device else None, sandbox=sandbox.value, settings=settings,
                            max_iterations=max_iterations, visualize=out.is_terminal and not as_json)
    except (EpisodeError, SandboxError) as exc:
        _fail(f"task {spec.id}: {exc}")
    try:
        run.write(output)
    except OSError as exc:
        _fail(f"--output {output}: {exc.strerror or exc}")
    if as_json:
        _print_json(run.summary())
    else:
        out.print(escape(model_report(run.final)))
        _render_result_table(run.final)
        out.print(f"episode reward {run.reward:g}; the conversation ended: {escape(run.ended)}; "
                  f"written to {escape(str(output))}/", soft_wrap=True)
    if run.ended.startswith("error"):
        err.print(f"[bold red]error:[/] the conversation failed: {escape(run.ended.removeprefix('error: '))}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_OK if run.final.correct else EXIT_TASK_FAILED)


def _openhands_model(model: str) -> str:
    """litellm's name for ``model``: kept when it starts with a litellm provider, else 'openai/' + model."""
    import litellm

    provider = model.split("/", 1)[0] if "/" in model else ""
    return model if provider in litellm.provider_list else f"openai/{model}"


if __name__ == "__main__":
    app()
