"""``kernel-env doctor``: renders ``kernel_env.workloads.ops.doctor``'s findings on this machine.

A table of facts and a list of what they mean, or (``--json``) ``Findings.to_record()``. The
probes take seconds; ``--grade`` adds the end-to-end grade of the bundled example (minutes on a
CPU), which is off by default.
Exit 2 when an essential is missing (an environment error), else 0. The probing and its
reading live in the library; nothing here decides what a fact means.
"""

from __future__ import annotations

import os

import typer
from rich.markup import escape
from rich.table import Table

from kernel_env.cli import options
from kernel_env.cli.common import EXIT_OK, EXIT_USAGE, Phases, out, print_json
from kernel_env.workloads.ops.doctor import Facts, Findings, examine


def doctor(as_json: options.Json = False,
           grade: bool = typer.Option(False, "--grade/--no-grade", help="Also grade the bundled example end to end "
                                      "(a minute or more on a CPU, several on a busy one): the one check that "
                                      "proves evaluations work here. Off by default: the probes alone take seconds.")
           ) -> None:
    """What this machine has (GPU, compilers, sandbox, tools) and what that means for kernel_env
    (seconds; --grade also grades the bundled example end to end)."""
    with Phases(quiet=False) as phases:  # on stderr: --json's stdout stays one JSON object
        if grade:
            phases.start("probing this machine and grading the bundled example",
                         "a minute or more on a CPU, several on a busy one")
        else:
            phases.start("probing this machine")
        findings = examine(grade=grade)
    if as_json:
        print_json(findings.to_record())
    else:
        _render(findings)
    raise typer.Exit(EXIT_OK if findings.ok else EXIT_USAGE)


def _render(findings: Findings) -> None:
    table = Table(show_header=False, show_edge=False, box=None, padding=(0, 1))
    for name, ok, detail in _rows(findings.facts):
        mark = "[green]✓[/]" if ok else ("[yellow]–[/]" if ok is None else "[red]✗[/]")
        table.add_row(mark, name, escape(str(detail)))
    out.print(table)
    out.print()
    out.print("[bold]What this means[/]")
    notes = Table.grid(padding=(0, 1))
    for line in findings.meaning:
        notes.add_row(" •", escape(line))
    for line in findings.missing:
        notes.add_row(" [red]✗[/]", f"[red]missing: {escape(line)}[/]")
    out.print(notes)


def _rows(f: Facts) -> list[tuple[str, bool | None, str]]:
    """(name, ok, detail) per fact; ok None marks what is optional and absent."""
    children, docker = f.evaluation_children, f.docker
    return [
        ("python", f.python.ok, f"{f.python.version} ({f.python.executable})"),
        ("torch", bool(f.torch.version), f.torch.version or f.torch.error or ""),
        ("GPU", bool(f.torch.gpus) or None, ", ".join(f.torch.gpus) if f.torch.gpus
         else f"none visible to torch (CUDA build: {f.torch.cuda_build or 'no'})"),
        ("nvidia-smi", bool(f.nvidia_smi.gpus) or None, "; ".join(f.nvidia_smi.gpus)
         or ("present, no GPU listed" if f.nvidia_smi.present else "not installed")),
        ("nvcc", bool(f.nvcc.version) or None, f"{f.nvcc.version} ({f.nvcc.path})" if f.nvcc.version else "not found"),
        ("triton", bool(f.triton.version) or None, f.triton.version or "not installed"),
        ("g++", bool(f.gxx.version), f.gxx.version or "not found"),
        ("ninja", bool(f.ninja.version), f.ninja.version or "not found"),
        ("bubblewrap", f.bubblewrap.works, f"{f.bubblewrap.version}, works" if f.bubblewrap.works
         else (f.bubblewrap.problem or "")),
        ("evaluation", children.works, ("children fork and answer" + ("" if children.isolated else ", NOT isolated"))
         if children.works else children.problem),
        ("cgroup", f.cgroup.available or None, f"{f.cgroup.version}, sandboxes get one" if f.cgroup.available
         else "cannot create one here"),
        ("ripgrep", bool(f.ripgrep.version) or None, f.ripgrep.version or "not found"),
        ("docker", bool(docker.engine) or None, f"engine {docker.engine}" if docker.engine
         else (f"{docker.client} (client only, no engine reachable)" if docker.client else "not installed")),
        ("running as", None if f.root else True, "root" if f.root else f"uid {os.geteuid()}"),
        *([] if f.grade is None else [
            ("grading", f.grade.correct, f"example/relu_add ({f.grade.language}, {f.grade.device}): "
             + (f"correct, {f.grade.seconds:.0f} s" if f.grade.correct else f"FAILED: {f.grade.error}"))]),
    ]
