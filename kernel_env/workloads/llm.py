"""What the runs against an OpenAI-compatible model server share (``generate``, ``eval``): the
default address (``synth --composer llm`` takes it too), checking that the server answers and
choosing the model to ask, the errors that end a run or fail a model call, and the counts every
run summary starts with.

This module talks to a server only to list its models; asking for completions, and what a run
does with them, belong to the workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import openai

#: Where a local vLLM server listens by default: the default of every --base-url.
DEFAULT_BASE_URL = "http://localhost:8000/v1"


class RunError(RuntimeError):
    """The run cannot go on here (the message says why and what to do): a usage or environment error."""


class ServerUnreachable(RunError):
    """The model server does not answer at its address."""


class NoChoices(openai.OpenAIError):
    """The server answered a chat completion without any choice (a failed model call, like an HTTP error)."""


@dataclass
class RunSummary:
    """What every run counts: the model asked, the tasks selected, and those skipped because the
    output already had them. Each workload's summary adds how the rest ended."""

    model: str = ""
    selected: int = 0
    skipped: int = 0

    @property
    def to_do(self) -> int:
        return self.selected - self.skipped


async def choose_model(client: openai.AsyncOpenAI, base_url: str, model: str | None, *, serve_hint: str) -> str:
    """Check that the server answers; the model to ask (``model``, or the server's only one).

    Raises ServerUnreachable when nothing answers at ``base_url`` (the message says how to start
    a server, ``serve_hint``), RunError when no model is named and the server does not list exactly one."""
    try:
        listed = await client.with_options(timeout=15.0, max_retries=0).models.list()
    except openai.APIConnectionError as exc:
        raise ServerUnreachable(f"cannot reach the model server at {base_url} ({why(exc)}); start it "
                                f"(for example `{serve_hint}`) or point --base-url at it") from None
    except openai.APIStatusError as exc:
        if model:
            return model  # a server without /models can still answer chat completions
        raise RunError(f"the model server at {base_url} did not list its models (HTTP {exc.status_code}); "
                       f"name the model with --model") from None
    if model:
        return model
    names = [entry.id for entry in listed.data]
    if len(names) != 1:
        raise RunError(f"the model server at {base_url} serves {len(names)} models"
                       f"{' (' + ', '.join(names[:10]) + ')' if names else ''}; choose one with --model")
    return names[0]


def why(exc: BaseException) -> str:
    """An exception's message with its cause's (the openai client hides the socket error in the cause)."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc}: {cause}" if cause is not None and str(cause) else str(exc)
