"""What the runs against an OpenAI-compatible model server share (``generate``, ``eval``): the
default address (``synth --composer llm`` takes it too), ``connect`` (checking that the server
answers, fast, and choosing the model to ask), the errors that end a run or fail a model call,
and the counts every run summary starts with.

This module talks to a server only to list its models, with httpx (not the openai client, whose
import alone takes most of a second); asking for completions, and what a run does with them,
belong to the workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

#: Where a local vLLM server listens by default: the default of every --base-url.
DEFAULT_BASE_URL = "http://localhost:8000/v1"

#: How to start a server, for the message that none answers: one for completions (generate),
#: one for tool-calling agents (eval).
SERVE_HINT = "vllm serve MODEL"
TOOL_SERVE_HINT = "vllm serve MODEL --enable-auto-tool-choice --tool-call-parser ..."


class RunError(RuntimeError):
    """The run cannot go on here (the message says why and what to do): a usage or environment error."""


class ServerUnreachable(RunError):
    """The model server does not answer at its address."""


class NoChoices(RuntimeError):
    """The server answered a chat completion without any choice (a failed model call, like an HTTP error)."""


@dataclass
class RunSummary:
    """What every run counts: the model asked (and the address that answered), the tasks
    selected, and those skipped because the output already had them. Each workload's summary adds
    how the rest ended."""

    model: str = ""
    base_url: str = ""
    selected: int = 0
    skipped: int = 0

    @property
    def to_do(self) -> int:
        return self.selected - self.skipped


@dataclass(frozen=True)
class Server:
    """A model server that answered: the address it answered at (``/v1`` added where the given
    one lacked it) and the model to ask."""

    base_url: str
    model: str


#: Seconds to wait for a connection to the server at the start of a run: a refused one fails at
#: once, this bounds an address that drops packets.
CONNECT_TIMEOUT_S = 5.0


def connect(base_url: str, model: str | None, *, api_key: str = "EMPTY", serve_hint: str,
            timeout: float = 15.0) -> Server:
    """Check that the server answers and choose the model to ask, with one request for its model
    list (no retries: a refused connection is reported at once). Never imports torch, so a command
    can call it first.

    A ``base_url`` whose path does not end in ``/v1`` that gets HTTP 404 is tried again with
    ``/v1`` added (vLLM and SGLang serve there), and the address that answered is returned.
    ``model`` must be one the server lists (a server that lists none, or has no model list, is
    taken at its word); without one, the server must list exactly one.

    Raises ServerUnreachable when nothing answers at ``base_url`` (the message says how to start a
    server, ``serve_hint``); RunError for a model the server does not serve (naming those it
    does), a refused API key, or no model named where the server does not list exactly one."""
    candidates = [base_url]
    if not base_url.rstrip("/").endswith("/v1"):
        candidates.append(base_url.rstrip("/") + "/v1")
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
    with httpx.Client(timeout=limits, headers=headers) as client:
        for url in candidates:
            try:
                response = client.get(url.rstrip("/") + "/models")
            except httpx.HTTPError as exc:
                raise ServerUnreachable(f"cannot reach the model server at {base_url} ({type(exc).__name__}: "
                                        f"{exc}); start it (for example `{serve_hint}`) or point --base-url at "
                                        f"it") from None
            if response.status_code == 404 and url != candidates[-1]:
                continue  # no /v1 in the address: try it with one
            if response.status_code in (401, 403):
                raise RunError(f"the model server at {url} refused the API key (HTTP {response.status_code}); pass "
                               f"the right one with --api-key or $OPENAI_API_KEY")
            names = _listed(response)
            if names is None:
                if model:
                    return Server(base_url, model)  # a server without a model list can still answer chat completions
                tried = " or ".join(f"{u.rstrip('/')}/models" for u in candidates[:candidates.index(url) + 1])
                fix = (f"is the address right? OpenAI-compatible servers (vLLM, SGLang) serve under /v1, as in "
                       f"{DEFAULT_BASE_URL}; " if response.status_code == 404 else "")
                raise RunError(f"the model server at {base_url} did not list its models at {tried} "
                               f"(HTTP {response.status_code}); {fix}name the model with --model")
            return Server(url, _chosen(url, model, names))
    raise AssertionError("unreachable: the last candidate returns or raises")


def _listed(response: httpx.Response) -> list[str] | None:
    """The model ids of an answer to GET /models, or None where it is not a model list."""
    try:
        entries = response.json()["data"] if response.is_success else None
        return [entry["id"] for entry in entries] if isinstance(entries, list) else None
    except (ValueError, KeyError, TypeError):
        return None


def _chosen(base_url: str, model: str | None, names: list[str]) -> str:
    """The model to ask of a server that lists ``names``."""
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    if model:
        if names and model not in names:
            raise RunError(f"the model server at {base_url} does not serve {model!r}; it serves {shown}: "
                           f"pass one of them to --model")
        return model
    if len(names) != 1:
        raise RunError(f"the model server at {base_url} serves {len(names)} models"
                       f"{' (' + shown + ')' if names else ''}; choose one with --model")
    return names[0]


def why(exc: BaseException) -> str:
    """An exception's message with its cause's (the openai client hides the socket error in the cause)."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc}: {cause}" if cause is not None and str(cause) else str(exc)
