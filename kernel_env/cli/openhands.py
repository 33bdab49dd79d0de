"""``kernel-env openhands TASK``: an OpenHands agent works on one task with kernel_env's tools in its sandbox.

The plug-in is ``kernel_env.integrations.openhands`` (the optional extra kernel_env[openhands]);
the episode ends with KernelAgent-v0's trusted final evaluation. Writes events.json,
messages.json, result.json (EvalResult.summary() and the episode's ending) and report.txt to
--output. Exit codes: 0 the final solution is correct; 1 it is not; 2 usage or environment
error (the extra missing, bad settings, no sandbox, the conversation failed: the model server
unreachable, say; the final evaluation of what was there is still written).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import typer
from rich.markup import escape

from kernel_env.cli import options
from kernel_env.cli.common import (
    EXIT_OK,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    ObservedPool,
    Phases,
    check_server,
    err,
    fail,
    out,
    print_json,
    render_result_table,
)
from kernel_env.cli.sources import resolve
from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.workloads.runs.llm import DEFAULT_BASE_URL, TOOL_SERVE_HINT, RunError, ServerUnreachable, connect


def openhands(
    task: options.TaskSpec,
    model: str = typer.Option(..., "--model", help="The model as the server lists it (checked at start), or a "
                                                   "litellm provider's model (anthropic/...)."),
    base_url: options.BaseUrl = DEFAULT_BASE_URL,
    api_key: options.ApiKey = "EMPTY",
    language: options.LanguageOrAuto = None,
    device: options.Device = None,
    sandbox: options.Sandbox = options.SandboxKind(DEFAULT_SANDBOX),
    max_iterations: int = typer.Option(150, "--max-iterations", min=1, help="Agent steps (model calls) at most."),
    output: Path = typer.Option(Path("openhands_run"), "--output", "-o", help="Directory for the conversation and the result."),
    settings_json: options.Settings = None,
    temperature: options.ServerTemperature = None,
    request_timeout: options.RequestTimeout = 900.0,
    kernelbench: options.KernelBench = None,
    as_json: options.Json = False,
) -> None:
    """Run an OpenHands agent on one task in its sandbox; write the conversation and the trusted final result."""
    from kernel_env.evaluators.records import Mode
    from kernel_env.evaluators.report import model_report
    from kernel_env.runtime.episode import EpisodeError
    from kernel_env.runtime.pool import default_pool
    from kernel_env.sandbox import SandboxError

    os.environ.setdefault("LOG_LEVEL", "ERROR")  # OpenHands' log would bury the report (set LOG_LEVEL to see it)
    try:
        # The plug-in first: importing it sets litellm's and OpenHands' environment defaults (no
        # banner, no cost map fetched from the network) before either is imported.
        # isort: off
        from kernel_env.integrations.openhands import run_openhands
        from openhands.sdk import LLM
        from pydantic import SecretStr
        # isort: on
    except ModuleNotFoundError as exc:
        fail(f"the OpenHands plug-in needs its extra ({exc.name or exc} is missing): pip install 'kernel_env[openhands]'")
    settings = options.parse_settings(settings_json)
    spec = resolve(task, kernelbench)
    model, base_url = _litellm_model(model, base_url, api_key)
    # OpenHands takes whole seconds.
    llm = LLM(model=model, base_url=base_url, api_key=SecretStr(api_key), usage_id="kernel-env",
              temperature=temperature, timeout=math.ceil(request_timeout), num_retries=2)
    visualize = out.is_terminal and not as_json  # OpenHands' own rendering of each event
    try:
        with Phases(quiet=as_json or visualize) as phases:
            pool = ObservedPool(default_pool(), lambda job: phases.start(
                "final evaluation", "a clean rebuild, evaluated by the trusted harness")
                if job.mode == Mode.FINAL else None)
            steps = _StepLines(phases)
            phases.start("the agent", f"{spec.id}, at most {max_iterations} steps")
            run = run_openhands(spec, llm, language=language.value if language else None,
                                device=device.value if device else None, sandbox=sandbox.value, pool=pool,
                                settings=settings, max_iterations=max_iterations, visualize=visualize,
                                callbacks=[steps])
    except (EpisodeError, SandboxError) as exc:
        fail(f"task {spec.id}: {exc}")
    try:
        run.write(output)
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    if as_json:
        print_json(run.summary())
    else:
        out.print(escape(model_report(run.final)))
        render_result_table(run.final)
        out.print(f"episode reward {run.reward:g}; the conversation ended: {escape(run.ended)}; "
                  f"written to {escape(str(output))}/", soft_wrap=True)
    if run.ended.startswith("error"):
        err.print(f"[bold red]error:[/] the conversation failed: {escape(run.ended.removeprefix('error: '))}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)
    if run.fault == "evaluator":
        err.print(f"[bold red]error:[/] the final evaluation failed by the evaluator's fault, not the agent's (no reward): "
                  f"{escape(run.final.error or '')}", soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_OK if run.final.correct else EXIT_TASK_FAILED)


class _StepLines:
    """An OpenHands event callback: a line per agent action (its step and tool), beside the phases."""

    def __init__(self, phases: Phases):
        self.phases, self.steps = phases, 0

    def __call__(self, event) -> None:
        tool = getattr(event, "tool_name", None)
        if tool and hasattr(event, "action"):  # an ActionEvent; its observation comes as another event
            self.steps += 1
            summary = getattr(event, "summary", None)
            self.phases.note(f"step {self.steps}: {tool}" + (f" ({summary})" if summary else ""))


def _litellm_model(model: str, base_url: str, api_key: str) -> tuple[str, str]:
    """litellm's name for ``model`` and the address to ask. A model with a litellm provider's prefix
    (``anthropic/...``) is that provider's to reach. Any other is asked of the OpenAI-compatible
    server at ``base_url``, checked first as eval checks it (it answers, ``/v1`` added where the
    address lacks it, the model is one it lists), and named ``openai/`` + model: litellm takes the
    prefix off, so a listed ``openai/gpt-oss-120b`` is asked as itself. ``openai/NAME`` where the
    server lists NAME is that."""
    import litellm

    provider = model.split("/", 1)[0] if "/" in model else ""
    if provider in litellm.provider_list and provider != "openai":
        return model, base_url
    try:
        server = connect(base_url, model, api_key=api_key, serve_hint=TOOL_SERVE_HINT)
    except ServerUnreachable as exc:
        fail(str(exc))
    except RunError as exc:
        if provider != "openai":
            fail(str(exc))
        server = check_server(base_url, model.removeprefix("openai/"), api_key, serve_hint=TOOL_SERVE_HINT)
    return f"openai/{server.model}", server.base_url
