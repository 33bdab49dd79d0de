"""The options and arguments more than one ``kernel-env`` command takes, declared once.

Each is a ``typing.Annotated`` alias a command's signature uses with its own default, so
``--device`` means the same and reads the same everywhere::

    def eval_command(device: options.Device = None, api_key: options.ApiKey = "EMPTY", ...)

An option only one command has stays in that command's module. Defaults that the library
owns (the model server's address, the language, the sandbox backend) come from the library.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer

from kernel_env.cli.common import fail
from kernel_env.languages import LANGUAGES

LanguageName = enum.Enum("LanguageName", {name: name for name in LANGUAGES}, type=str)
SandboxKind = enum.Enum("SandboxKind", {"local": "local", "docker": "docker"}, type=str)


class DeviceName(str, enum.Enum):
    cuda = "cuda"
    cpu = "cpu"


# ----------------------------------------------------------------------------- tasks

TaskSpec = Annotated[str, typer.Argument(
    help="example/relu_add, a task .py, FILE.jsonl#ID, or kernelbench/L<level>/<id>.")]
Source = Annotated[str, typer.Argument(
    help="'examples', a task .py file, a .jsonl/.json/.parquet file of task records (KernelBench export, KernelBook, "
         "CUDA-Agent-Ops-6K, `kernel-env synth` output), a KernelBench checkout, or a folder of record files.")]
KernelBench = Annotated[Path | None, typer.Option(
    "--kernelbench", help="KernelBench checkout for kernelbench/L<level>/<id> tasks (default: $KERNEL_ENV_KERNELBENCH).")]

# The filters of a task source, applied in this order (kernel_env.cli.sources.select).
Level = Annotated[int | None, typer.Option("--level", help="Only tasks of this level.")]
Name = Annotated[str | None, typer.Option(
    "--name", help="Only tasks whose id or name contains this (case-insensitive).")]
Sample = Annotated[int | None, typer.Option("--sample", min=1, help="A random sample of this many tasks.")]
SampleSeed = Annotated[int, typer.Option("--seed", help="Seed for --sample (the same seed gives the same sample).")]
Count = Annotated[int | None, typer.Option("--count", min=1, help="At most this many tasks (after the other filters).")]

# ----------------------------------------------------------------------------- where code runs

# Every command's language follows the machine unless named: LanguageOrAuto with the default None, which
# kernel_env.runtime.episode.language_and_device resolves (the one rule, for the CLI and Python alike).
LanguageOrAuto = Annotated[LanguageName | None, typer.Option(
    "--language", "-l", help="What the kernels are written in (default: cuda with a GPU, else cpp).")]
Device = Annotated[DeviceName | None, typer.Option(
    "--device", help="Where code is run and timed (default: cuda if there is a GPU, else cpu).")]
Sandbox = Annotated[SandboxKind, typer.Option("--sandbox", help="Sandbox backend.")]
Settings = Annotated[str | None, typer.Option(
    "--settings", help="Evaluation protocol overrides as JSON, e.g. '{\"timed_calls\": 10, \"compile_baseline\": false}'.")]

# ----------------------------------------------------------------------------- the model server
# The default address is kernel_env.workloads.runs.llm.DEFAULT_BASE_URL.

BaseUrl = Annotated[str, typer.Option(
    "--base-url", help="OpenAI-compatible model server (vLLM, SGLang, OpenAI; agents need tool calling); an address "
                       "without /v1 is tried with it.")]
Model = Annotated[str | None, typer.Option(
    "--model", help="Model name, one the server lists (default: the server's model; name one where it serves several).")]
ApiKey = Annotated[str, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="API key, if the server wants one.")]
Temperature = Annotated[float, typer.Option("--temperature", min=0.0, help="Sampling temperature.")]
ServerTemperature = Annotated[float | None, typer.Option(
    "--temperature", min=0.0, help="Sampling temperature (default: the server's).")]
MaxTokens = Annotated[int | None, typer.Option(
    "--max-tokens", min=1, help="Cap on each answer's tokens (default: the server's).")]
RequestTimeout = Annotated[float, typer.Option("--request-timeout", min=1.0, help="Seconds one model call may take.")]

# ----------------------------------------------------------------------------- output

Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for machines) instead of tables.")]
Plot = Annotated[Path | None, typer.Option(
    "--plot", help="Save the speed-up distribution here (PNG; needs matplotlib, in the eval extra).")]
Markdown = Annotated[Path | None, typer.Option(
    "--markdown", help="Write the metrics as markdown tables here ('-': stdout).")]

# ----------------------------------------------------------------------------- synth

Threshold = Annotated[float, typer.Option(
    "--threshold", min=0.0, max=1.0, help="Drop tasks whose AST similarity to an evaluation task is above this.")]
NoTransformers = Annotated[bool, typer.Option(
    "--no-transformers", help="No transformers seeds, even where transformers is installed.")]


def parse_settings(text: str | None):
    """EvalSettings from --settings (a JSON object of its fields), or None for the protocol's defaults."""
    from pydantic import ValidationError

    from kernel_env.evaluators.records import EvalSettings

    if text is None:
        return None
    fields = ", ".join(EvalSettings.model_fields)
    try:
        given = json.loads(text)
    except ValueError as exc:
        fail(f"--settings: not JSON ({exc}); give an object like '{{\"timed_calls\": 10}}'")
    if not isinstance(given, dict):
        fail(f"--settings: give a JSON object of protocol fields ({fields})")
    unknown = sorted(set(given) - set(EvalSettings.model_fields))
    if unknown:  # pydantic would drop them silently, and a typo would go unnoticed
        fail(f"--settings: {', '.join(unknown)}: no such field (fields: {fields})")
    try:
        return EvalSettings.model_validate(given)
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = ".".join(str(part) for part in problem["loc"]) or "the value"
        fail(f"--settings: {field}: {problem['msg']} (fields: {fields})")
