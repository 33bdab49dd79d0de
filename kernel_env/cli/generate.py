"""``kernel-env generate``: refine-loop traces (SFT data) from a model behind an OpenAI-compatible server.

The run is ``kernel_env.workloads.runs.generate``; here are its options, its progress bar and its
summary. Exit codes: 0 every selected sample has a trace in the output (a wrong or slow kernel
is data, not a failure); 1 some samples ended without one (their model calls failed: rerun to
retry them); 2 usage or environment error (no source, unreadable output, server unreachable, no
sandbox, or samples dropped because an evaluation failed by the evaluator's fault: rerun to retry
them); 130 interrupted (every finished trace is kept: rerun to resume).
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape

from kernel_env.cli import options
from kernel_env.cli.common import (
    EXIT_INTERRUPTED,
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
from kernel_env.config import DEFAULT_POOL, DEFAULT_SANDBOX
from kernel_env.tasks import TaskError
from kernel_env.workloads.runs.llm import DEFAULT_BASE_URL, SERVE_HINT


def generate(
    base_url: options.BaseUrl = DEFAULT_BASE_URL,
    model: options.Model = None,
    multi_turn: bool = typer.Option(False, "--multi-turn", help="Feedback rounds: answer errors, mismatches and slow "
                                                                "kernels until success or --max-turns."),
    max_turns: int = typer.Option(4, "--max-turns", min=1, help="Answers per sample at most, with --multi-turn."),
    batch_size: int = typer.Option(10, "--batch-size", min=1, help="Generations in flight at once."),
    output: Path = typer.Option(Path("reasoning_traces.json"), "--output", "-o",
                                help="Traces (a JSON list). Rerunning with the same file skips finished samples."),
    # --kernelbench here is a source of samples (all of a checkout), not the root kernelbench/L<level>/<id> resolves in.
    kernelbench: Path | None = typer.Option(None, "--kernelbench", help="A KernelBench checkout (level1/ …)."),
    kernelbook: Path | None = typer.Option(None, "--kernelbook", help="A JSONL file of KernelBook task records."),
    tasks_spec: str | None = typer.Option(None, "--tasks", help="More tasks: 'examples', a .py, a .jsonl or a "
                                                                 "KernelBench checkout (all of them)."),
    kernelbench_samples: int = typer.Option(1000, "--kernelbench-samples", min=0, help="At most this many KernelBench problems."),
    kernelbook_samples: int = typer.Option(1500, "--kernelbook-samples", min=0, help="At most this many KernelBook records."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random sample of a capped source."),
    language: options.LanguageOrAuto = None,
    device: options.Device = None,
    sandbox: options.Sandbox = options.SandboxKind(DEFAULT_SANDBOX),
    pool: str = typer.Option(DEFAULT_POOL, "--pool", help="Evaluation pool: local (this machine's GPUs, or its CPU) "
                                                     "or ray (a Ray cluster: ray.init's default address)."),
    temperature: options.Temperature = 0.7,
    max_tokens: options.MaxTokens = None,
    request_timeout: options.RequestTimeout = 900.0,
    max_active: int | None = typer.Option(None, "--max-active", min=1, help="Samples in the line at once, each with its "
                                                                            "workspace (default: 4 × --batch-size)."),
    api_key: options.ApiKey = "EMPTY",
    as_json: options.Json = False,
) -> None:
    """Generate refine-loop traces (SFT data) with a model behind an OpenAI-compatible server."""
    if kernelbench is None and kernelbook is None and tasks_spec is None:
        fail("no samples: give --kernelbench DIR, --kernelbook FILE.jsonl and/or --tasks SPEC")
    if pool not in ("local", "ray"):
        fail(f"unknown --pool {pool!r}; choose local or ray")
    server = check_server(base_url, model, api_key, serve_hint=SERVE_HINT)

    from kernel_env.workloads.runs.generate import (  # torch, after the checks that need none
        GenerateConfig,
        GenerateError,
        TraceStore,
        generate as run_generate,
        select_tasks,
    )

    try:
        selected = select_tasks(kernelbench=kernelbench, kernelbook=kernelbook, tasks=tasks_spec,
                                kernelbench_samples=kernelbench_samples, kernelbook_samples=kernelbook_samples, seed=seed)
    except TaskError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot read the samples: {exc}")
    config = GenerateConfig(base_url=server.base_url, model=server.model, api_key=api_key, multi_turn=multi_turn, max_turns=max_turns,
                            batch_size=batch_size, max_active=max_active, language=language.value if language else None,
                            device=device.value if device else None, sandbox=sandbox.value, pool=pool,
                            temperature=temperature, max_tokens=max_tokens, request_timeout=request_timeout)
    store = TraceStore(output)
    try:
        store.open()
    except (GenerateError, OSError) as exc:
        fail(str(exc))
    started = time.monotonic()
    with progress_bar(disable=as_json or not err.is_terminal) as progress:
        bar = progress.add_task("generating", total=sum(task.id not in store.finished for task in selected))

        def report(summary, waiting: int, event: str) -> None:
            progress.update(bar, total=summary.to_do,
                            completed=summary.written + len(summary.failed) + len(summary.evaluator_faults),
                            description=f"{summary.success_fast} fast · {summary.max_turns_reached} max turns · "
                                        f"{len(summary.failed)} failed · {len(summary.evaluator_faults)} evaluator "
                                        f"faults · {waiting} in line")
            if not err.is_terminal and not as_json:
                err.print(escape(stamped(time.monotonic() - started, event)), soft_wrap=True)

        try:
            summary = run_interruptibly(run_generate(selected, config, store, on_progress=report))
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] {len(store.traces)} traces are in {escape(str(output))}; "
                      "rerun the same command to go on")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except GenerateError as exc:
            fail(f"{exc} ({len(store.traces)} traces are in {output})")
    result = {"output": str(output), "model": summary.model, "selected": summary.selected, "skipped": summary.skipped,
              "written": summary.written, "success_fast": summary.success_fast,
              "max_turns_reached": summary.max_turns_reached, "failed": summary.failed,
              "evaluator_faults": summary.evaluator_faults}
    if as_json:
        print_json(result)
    else:
        out.print(f"{summary.written} new traces in {escape(str(output))} ({summary.success_fast} success_fast, "
                  f"{summary.max_turns_reached} max_turns_reached); {summary.skipped} samples were already there; "
                  f"model {escape(summary.model)}")
    raise typer.Exit(end_of_run(out, failed=summary.failed, evaluator_faults=summary.evaluator_faults, quiet=as_json,
                                fault_note="dropped: an evaluation failed by the evaluator's fault"))
