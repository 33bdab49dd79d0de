"""What every client of an OpenAI-compatible model server here shares (`generate`, `eval`):
checking that the server answers and choosing the model to ask."""

from __future__ import annotations

import openai


async def choose_model(client: openai.AsyncOpenAI, base_url: str, model: str | None, *,
                       unreachable: type[Exception], error: type[Exception], serve_hint: str) -> str:
    """Check that the server answers; the model to ask (``model``, or the server's only one).

    Raises ``unreachable`` when nothing answers at ``base_url`` (the message says how to start a
    server, ``serve_hint``), ``error`` when no model is named and the server does not list exactly one."""
    try:
        listed = await client.with_options(timeout=15.0, max_retries=0).models.list()
    except openai.APIConnectionError as exc:
        raise unreachable(f"cannot reach the model server at {base_url} ({why(exc)}); start it "
                          f"(for example `{serve_hint}`) or point --base-url at it") from None
    except openai.APIStatusError as exc:
        if model:
            return model  # a server without /models can still answer chat completions
        raise error(f"the model server at {base_url} did not list its models (HTTP {exc.status_code}); "
                    f"name the model with --model") from None
    if model:
        return model
    names = [entry.id for entry in listed.data]
    if len(names) != 1:
        raise error(f"the model server at {base_url} serves {len(names)} models"
                    f"{' (' + ', '.join(names[:10]) + ')' if names else ''}; choose one with --model")
    return names[0]


def why(exc: BaseException) -> str:
    """An exception's message with its cause's (the openai client hides the socket error in the cause)."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc}: {cause}" if cause is not None and str(cause) else str(exc)
