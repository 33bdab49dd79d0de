"""Runs KernelAgent-v0 episodes with a tool-calling model behind an OpenAI-compatible server
(vLLM, SGLang, OpenAI), many at once, and writes one JSONL record per finished episode.

- ``run_agent_eval`` (``AgentRunConfig``, ``EvalSummary``): the run, ``concurrency`` episodes at once.
- ``Conversation``: one episode, a ReAct conversation in OpenAI format (a whole reply is one
  environment step), ending in an ``EpisodeRecord`` (``kernel_env.workloads.analysis.metrics``).
- ``RunFile``: the output, a journal of records (``kernel_env.workloads.runs.journal``).
- ``assistant_message``, ``tool_messages``, ``request_message``: the messages kept and sent.

Before touching it: a record is on disk (fsynced) when its episode ends, and a rerun with the
same output skips every task whose record has a verdict (not "error" nor "evaluator_fault"), so
a run is resumed by running it again. A failed episode never ends the run: it is a record with
``stop="error"``. Only a server that cannot be reached does (``ServerUnreachable``); before the
first episode it leaves no file. The episode, the record, failures and resume: docs/eval.md.

Why one module of ~500 lines: the configuration, the run file, the run and the conversation are
one run's parts, each small, and each is read against the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import openai

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.envs.agent import KernelAgentEnv
from kernel_env.evaluators.records import EvalSettings
from kernel_env.languages import get_language
from kernel_env.runtime.episode import (
    EpisodeError,
    Selection,
    check_device,
    language_and_device,
)
from kernel_env.runtime.pool import GpuPool
from kernel_env.tasks import Task
from kernel_env.workloads.runs.journal import Journal, JournalError
from kernel_env.workloads.runs.llm import (
    DEFAULT_BASE_URL,
    TOOL_SERVE_HINT,
    NoChoices,
    RunError,
    RunSummary,
    ServerUnreachable,
    connect,
    why,
)
from kernel_env.workloads.analysis.metrics import UNDECIDED_STOPS, EpisodeRecord, RecordError, read_records

log = logging.getLogger(__name__)

#: The paper's evaluation budget (training uses 150).
DEFAULT_MAX_TURNS = 200

SYSTEM_PROMPT = """\
You are an expert GPU kernel engineer working in a sandboxed workspace through tools. Your goal is \
a ModelNew that is correct and faster than both PyTorch eager and torch.compile.

Work step by step: read SKILL.md and the reference, write kernels and model_new.py, build, verify \
and profile with the workspace's scripts, and iterate. Act only through tool calls; you may make \
several in one reply, and they run in order. When kernels/ and model_new.py hold your final \
solution, call Finish: it is then rebuilt and evaluated by the trusted harness, and that \
evaluation is your result."""

NUDGE = ("Your reply had no tool call, so nothing was done (the environment's answer is above). Act through "
         "the tool-calling interface: call a tool (Bash, Read, Write, Edit, ...), or Finish when kernels/ and "
         "model_new.py hold your final solution.")


#: The run's error under the name this module's callers know (``ServerUnreachable`` is one).
EvalRunError = RunError


class ModelCallFailed(RuntimeError):
    """A model call failed after its retries; ``unreachable`` when the last try could not connect."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


# ============================================================================ configuration


#: The context CUDA Agent trains and evaluates with (128k tokens): the default token budget of an episode.
DEFAULT_CONTEXT_TOKENS = 131_072


class ContextFull(RuntimeError):
    """The server refused a model call as past the model's context (HTTP 400 saying so)."""


#: How servers word a request past the context: vLLM ("maximum context length"), OpenAI
#: ("context_length_exceeded"), SGLang ("longer than the model's context length").
_CONTEXT_REFUSAL = re.compile(r"context[ _]length|context window", re.IGNORECASE)


@dataclass(frozen=True)
class AgentRunConfig:
    """How to run: the server and model, the environment, the concurrency.

    ``model`` None takes the server's only model. ``language`` and ``device`` None follow the
    machine (``language_and_device``: cuda on a GPU, cpp on the CPU). ``concurrency`` bounds the episodes in flight
    (each holds a workspace, a sandbox and a conversation). ``model_retries`` extra tries per
    model call, waiting ``retry_delay_s`` × 2^try between them. ``settings`` and ``pool`` go to
    every environment (None: the protocol's defaults, the process's shared local pool).
    ``max_context_tokens``: an episode whose conversation reaches this many tokens (the server's
    count for its last call, prompt and completion) ends there, as at the turn limit, with the
    final evaluation of what is in the workspace; so does one the server refuses as past the
    model's context. None: only the server's refusal ends it."""

    base_url: str = DEFAULT_BASE_URL
    model: str | None = None
    api_key: str = "EMPTY"
    language: str | None = None
    device: str | None = None
    sandbox: str = DEFAULT_SANDBOX
    max_turns: int = DEFAULT_MAX_TURNS
    selection: Selection = "best"
    concurrency: int = 8
    temperature: float | None = None
    max_tokens: int | None = None
    request_timeout: float = 900.0
    model_retries: int = 3
    retry_delay_s: float = 2.0
    system_prompt: str = SYSTEM_PROMPT
    settings: EvalSettings | None = None
    pool: GpuPool | str | None = None
    max_context_tokens: int | None = DEFAULT_CONTEXT_TOKENS


@dataclass
class EvalSummary(RunSummary):
    """What a run did. ``errors`` maps tasks whose episode ended in error to why, and
    ``evaluator_faults`` those whose final evaluation failed by the evaluator's fault (a rerun
    retries both)."""

    finished: int = 0
    turn_limit: int = 0
    context_limit: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    evaluator_faults: dict[str, str] = field(default_factory=dict)

    @property
    def written(self) -> int:
        return self.finished + self.turn_limit + self.context_limit + len(self.errors) + len(self.evaluator_faults)


#: Called after every episode's record is written: (the record, the summary so far).
ProgressCallback = Callable[[EpisodeRecord, EvalSummary], None]
#: Called after every step of an episode: (task id, turn, max turns).
TurnCallback = Callable[[str, int, int], None]


# ============================================================================ the output


class RunFile:
    """A run's JSONL output: one episode record per line, a journal (``kernel_env.workloads.runs.journal``):
    each record is on disk (fsynced) when its episode's ``append`` returns.

    ``read`` reads what is there, if anything, and changes nothing; it raises RecordError for a file
    that is not a run file: every line must be an episode record, as ``kernel-env report`` reads
    it, but a torn last line (a record half-written when a run was killed: its episode did not
    finish) is left out. ``create`` makes the file when the run starts, so a run that never
    started leaves none, and cuts that torn line. The file's mode is the umask's (0644 under the
    usual 022), as for every output."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = Journal(self.path)
        self.records: list[EpisodeRecord] = []

    def read(self) -> RunFile:
        self.records = read_records(self.path) if self.path.exists() else []
        return self

    def create(self) -> RunFile:
        """Make the (empty) file if it is not there yet, and its folder; cut a torn last line."""
        self.journal.create()
        return self

    def open(self) -> RunFile:
        """``read``, then ``create``."""
        return self.read().create()

    @property
    def done(self) -> set[str]:
        """Tasks with a record that has a verdict (not an error, not an evaluator's fault): a rerun skips them."""
        return {record.task_id for record in self.records if record.stop not in UNDECIDED_STOPS}

    def append(self, record: EpisodeRecord) -> None:
        """Write one record as a line; on disk (flushed, fsynced) when this returns."""
        self.journal.append(record.model_dump_json())
        self.records.append(record)

# ============================================================================ the run


async def run_agent_eval(tasks: Iterable[Task], config: AgentRunConfig, output: str | Path, *,
                         on_record: ProgressCallback | None = None,
                         on_turn: TurnCallback | None = None) -> EvalSummary:
    """Run one KernelAgent-v0 episode per task, ``config.concurrency`` at a time, appending each
    record to ``output`` as its episode ends.

    Args:
        tasks: the tasks; those with a record that has a verdict in ``output`` are skipped.
        config: the server and model, the environment, the concurrency.
        output: the run file (JSONL); made only once the server has answered.
        on_record: called after every record is written: (the record, the summary so far).
        on_turn: called after every environment step of every episode: (task id, turn, max turns).

    Returns:
        The summary: episodes by how they stopped, ``errors`` and ``evaluator_faults`` with why,
        the model, and ``base_url``, the address that answered (``config.base_url`` with ``/v1``
        added where it lacked it and needed it).

    Raises:
        EvalRunError: a configuration that cannot work here (a language the device cannot run,
            an output that is not a run file, a model the server does not serve).
        ServerUnreachable: the server does not answer, before the first episode (nothing is
            written) or when it stops answering (finished records are kept)."""
    tasks = list(tasks)
    if config.concurrency < 1:
        raise EvalRunError(f"concurrency must be at least 1, got {config.concurrency}")
    try:
        language, device = language_and_device(config.language, config.device)
        check_device(get_language(language), device)
    except (EpisodeError, ValueError) as exc:
        raise EvalRunError(str(exc)) from None
    run_file = RunFile(output)
    try:
        run_file.read()
    except RecordError as exc:
        raise EvalRunError(f"{exc}; move it away or pass another --output") from None
    except OSError as exc:
        raise EvalRunError(f"output {output}: {exc.strerror or exc}") from None
    done = run_file.done
    todo = [task for task in tasks if task.id not in done]
    summary = EvalSummary(selected=len(tasks), skipped=len(tasks) - len(todo))
    # Nothing is written until the server has answered: a run that cannot start leaves no file.
    server = await asyncio.to_thread(connect, config.base_url, config.model, api_key=config.api_key,
                                     serve_hint=TOOL_SERVE_HINT)
    summary.model, summary.base_url = server.model, server.base_url
    config = dataclasses.replace(config, base_url=server.base_url, model=server.model, language=language, device=device)
    try:
        run_file.create()
    except JournalError as exc:
        raise EvalRunError(f"output {output}: {exc}") from None
    except OSError as exc:
        raise EvalRunError(f"output {output}: {exc.strerror or exc}") from None
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=config.api_key, timeout=config.request_timeout,
                                max_retries=0)
    try:
        if todo:
            await _Run(config, client, run_file, summary, on_record, on_turn).run(todo)
    finally:
        await client.close()
    return summary


class _Run:
    """One run: the episodes in flight, the output, the summary."""

    def __init__(self, config: AgentRunConfig, client: openai.AsyncOpenAI, run_file: RunFile, summary: EvalSummary,
                 on_record: ProgressCallback | None, on_turn: TurnCallback | None = None):
        self.config, self.client, self.run_file, self.summary = config, client, run_file, summary
        self.on_record, self.on_turn = on_record, on_turn
        self.slots = asyncio.Semaphore(config.concurrency)

    async def run(self, todo: list[Task]) -> None:
        """Every episode, ``concurrency`` at a time. A ServerUnreachable from one cancels the others
        (their episodes are closed and left without a record, so a rerun does them)."""
        try:
            async with asyncio.TaskGroup() as group:
                for task in todo:
                    group.create_task(self._slot(task))
        except* ServerUnreachable as failures:
            raise failures.exceptions[0] from None

    async def _slot(self, task: Task) -> None:
        async with self.slots:
            episode = Conversation(task, self.config, self.client, self.summary.model, on_turn=self.on_turn)
            record = await episode.run()
        self.run_file.append(record)
        if record.stop == "error":
            self.summary.errors[task.id] = record.error or "unknown error"
        elif record.stop == "evaluator_fault":
            self.summary.evaluator_faults[task.id] = record.error or "the evaluator failed"
        elif record.stop == "turn_limit":
            self.summary.turn_limit += 1
        elif record.stop == "context_limit":
            self.summary.context_limit += 1
        else:
            self.summary.finished += 1
        if self.on_record is not None:
            self.on_record(record, self.summary)
        if episode.server_unreachable:
            raise ServerUnreachable(f"the model server at {self.config.base_url} stopped answering ({record.error}); "
                                    f"{len(self.run_file.records)} records are in {self.run_file.path}: rerun to resume")


# ============================================================================ one episode


class Conversation:
    """One episode: the conversation between the model and a KernelAgent-v0 environment, ending in a record."""

    def __init__(self, task: Task, config: AgentRunConfig, client: openai.AsyncOpenAI, model: str, *,
                 on_turn: TurnCallback | None = None):
        self.task, self.config, self.client, self.model = task, config, client, model
        self.on_turn = on_turn
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.language, self.device = language_and_device(config.language, config.device)
        self.reward = 0.0
        self.tool_calls = 0
        self.tokens: dict[str, int] | None = None
        self.server_unreachable = False
        self.started = time.monotonic()

    async def run(self) -> EpisodeRecord:
        """Play the episode to its end; never raises but for cancellation (a failure is a record)."""
        env: KernelAgentEnv | None = None
        try:
            env = KernelAgentEnv(self.task, language=self.language, device=self.device,
                                 sandbox=self.config.sandbox, pool=self.config.pool, max_turns=self.config.max_turns,
                                 selection=self.config.selection, settings=self.config.settings)
            stop = await self._play(env)
            return self._record(stop)
        except asyncio.CancelledError:
            if env is not None:
                env.close()
            env = None
            raise
        except ModelCallFailed as exc:
            self.server_unreachable = exc.unreachable
            return self._record("error", str(exc))
        except Exception as exc:  # noqa: BLE001 - one broken episode must not end a long run; the record says why
            log.exception("task %s: the episode failed", self.task.id)
            return self._record("error", f"the episode failed: {type(exc).__name__}: {exc}")
        finally:
            if env is not None:
                await asyncio.to_thread(env.close)

    async def _play(self, env: KernelAgentEnv) -> str:
        prompt, self.info = await env.areset()
        self.tools, self.device = self.info["tools"], self.info["device"]
        self.messages = [{"role": "system", "content": self.config.system_prompt}, {"role": "user", "content": prompt}]
        budget = self.config.max_context_tokens
        while True:
            try:
                reply = await self._ask()
            except ContextFull as exc:
                return await self._cut(env, f"The model server refused the next call as past the model's context: "
                                            f"{exc}")
            self.messages.append(reply)
            calls = reply.get("tool_calls") or []
            self.tool_calls += max(1, len(calls))
            observation, reward, terminated, truncated, self.info = await env.astep(calls or (reply.get("content") or ""))
            self.reward += reward
            if self.on_turn is not None:
                self.on_turn(self.task.id, self.info.get("turn", 0), self.config.max_turns)
            if calls:
                self.messages += tool_messages(calls, self.info["tool_results"])
            else:
                self.messages.append({"role": "user", "content": f"{observation}\n\n{NUDGE}"})
            if terminated or truncated:
                if self.info.get("fault") == "evaluator":
                    return "evaluator_fault"
                return "finished" if terminated else "turn_limit"
            if budget is not None and self.tokens and self.tokens["context"] >= budget:
                return await self._cut(env, f"The context budget ({budget} tokens) was reached.")

    async def _cut(self, env: KernelAgentEnv, reason: str) -> str:
        """End the episode for the context: the environment's final evaluation, as at the turn limit."""
        _, reward, _, _, self.info = await env.atruncate(reason)
        self.reward += reward
        return "evaluator_fault" if self.info.get("fault") == "evaluator" else "context_limit"

    async def _ask(self) -> dict[str, Any]:
        """The model's next assistant message (as a dict for ``messages``), with retries."""
        options: dict[str, Any] = {"model": self.model, "messages": [request_message(m) for m in self.messages],
                                   "tools": self.tools}
        if self.config.temperature is not None:
            options["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            options["max_tokens"] = self.config.max_tokens
        tries = 1 + self.config.model_retries
        for attempt in range(tries):
            try:
                response = await self.client.chat.completions.create(**options)
                if not response.choices:
                    raise NoChoices("the server answered with no choices")
                self._count(response.usage)
                return assistant_message(response.choices[0].message, turn=len(self.messages))
            except openai.APIStatusError as exc:
                if exc.status_code == 400 and _CONTEXT_REFUSAL.search(why(exc)):
                    raise ContextFull(why(exc)) from None
                if exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                    raise ModelCallFailed(f"model call failed (HTTP {exc.status_code}, not retried): {why(exc)}") from None
                last: Exception = exc
            except (openai.APIConnectionError, NoChoices) as exc:
                last = exc
            if attempt + 1 < tries:
                await asyncio.sleep(self.config.retry_delay_s * 2 ** attempt)
        unreachable = isinstance(last, openai.APIConnectionError) and not isinstance(last, openai.APITimeoutError)
        raise ModelCallFailed(f"model call failed after {tries} tries: {type(last).__name__}: {why(last)}",
                              unreachable=unreachable)

    def _count(self, usage: Any) -> None:
        """Add a call's tokens, as the server counted them (nothing where it reported none)."""
        if usage is None:
            return
        tokens = self.tokens or {"prompt": 0, "completion": 0, "context": 0}
        tokens["prompt"] += usage.prompt_tokens or 0
        tokens["completion"] += usage.completion_tokens or 0
        tokens["context"] = max(tokens["context"], (usage.prompt_tokens or 0) + (usage.completion_tokens or 0))
        self.tokens = tokens

    def _record(self, stop: str, error: str | None = None) -> EpisodeRecord:
        final = self.info.get("final") if stop != "error" else None
        if stop == "evaluator_fault":
            error = f"the final evaluation failed by the evaluator's fault: {(final or {}).get('error')}"
        return EpisodeRecord(
            task_id=self.task.id, source=self.task.source, level=self.task.level, name=self.task.name,
            language=self.language, device=self.device,
            model=self.model, stop=stop, error=error, final=final,
            final_report=self.info.get("final_report") if final else None,
            reward=self.reward if final is not None and stop != "evaluator_fault" else None, turns=self.info.get("turn", 0),
            max_turns=self.config.max_turns, tool_calls=self.tool_calls, invalid_calls=self.info.get("invalid_calls", 0),
            tokens=self.tokens, rollout=self.info.get("rollout"),
            evaluations=self.info.get("evaluations", []), messages=self.messages, tools=self.tools,
            settings=self.config.settings.model_dump() if self.config.settings else None,
            duration_s=round(time.monotonic() - self.started, 3),
            timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )


# ============================================================================ messages


def assistant_message(message: Any, *, turn: int) -> dict[str, Any]:
    """An OpenAI ``ChatCompletionMessage`` as the dict kept in ``messages``: content, tool calls
    (each with an id: one is made up, ``call_<turn>_<i>``, where the server gave none) and any
    reasoning the server separated out (vLLM's ``reasoning_content``)."""
    result: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get("reasoning_content")
    if reasoning:
        result["reasoning_content"] = reasoning
    if message.tool_calls:
        result["tool_calls"] = [
            {"id": call.id or f"call_{turn}_{index}", "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for index, call in enumerate(message.tool_calls)
        ]
    return result


def tool_messages(calls: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``tool`` message per call, in order, answering its id with its result's output (the
    environment answers every call it was given, in order)."""
    if len(results) != len(calls):
        raise RuntimeError(f"the environment answered {len(results)} results to {len(calls)} tool calls")
    return [{"role": "tool", "tool_call_id": call["id"], "content": result["output"]}
            for call, result in zip(calls, results)]


def request_message(message: dict[str, Any]) -> dict[str, Any]:
    """A kept message as sent back to the server: without ``reasoning_content`` (servers expect
    earlier reasoning dropped, and some reject the field)."""
    return {key: value for key, value in message.items() if key != "reasoning_content"}
