"""`kernel-env generate`: the seed orchestrator's refine loop against an OpenAI-compatible server.

- ``generate`` (``GenerateConfig``, ``GenerateSummary``): rounds of: pop up to ``batch_size``
  items, ask the model for all of them at once, evaluate every answer in its sample's own
  ``KernelRefineEnv``, then requeue each item with its feedback or finalise its trace.
- ``RefineQueue``, ``QueueItem``: the seed's passive FIFO (add, pop, should_stop, build_feedback,
  requeue_with_feedback, finalize); it calls no model and evaluates nothing.
- ``TraceStore``: the output (a JSON list of traces) and its journal.
- ``select_tasks``: a run's samples, from local files.

Before touching it: the queue speaks the refine protocol (``kernel_env.envs.refine_protocol``)
that the environment speaks, and the run checks that the two agree on every prompt and every
stop. A sample whose model call failed, or whose evaluation failed by the evaluator's fault, is
dropped without a trace (a rerun tries it again). A finished trace is on disk (journal, fsync)
before anything else happens, and this module never deletes one. The loop, failures, output and
resume: docs/refine.md, kernel-env generate.

Why one module of ~500 lines: the queue, the output and the orchestrator are the seed's one loop;
each is small, and the orchestrator is read against the other two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import secrets
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.envs.refine import KernelRefineEnv
from kernel_env.envs.refine_protocol import (
    StopReason,
    TurnResult,
    build_feedback,
    build_messages,
    build_trace,
    sample_of,
    should_stop,
)
from kernel_env.evaluators.records import EvalSettings
from kernel_env.languages import get_language
from kernel_env.runtime.episode import EpisodeError, check_device, language_and_device
from kernel_env.runtime.pool import GpuPool, shared_pool
from kernel_env.sandbox import SandboxError
from kernel_env.tasks import Task, TaskError, load_jsonl, load_kernelbench, load_tasks
from kernel_env.workloads.runs.journal import Journal, JournalError
from kernel_env.workloads.runs.llm import (
    DEFAULT_BASE_URL,
    SERVE_HINT,
    NoChoices,
    RunError,
    RunSummary,
    ServerUnreachable,
    connect,
    why,
)

DEFAULT_OUTPUT = "reasoning_traces.json"

#: The run's error under the name this module's callers know (``ServerUnreachable`` is one).
GenerateError = RunError


# ============================================================================ the queue


@dataclass
class QueueItem:
    """One sample on its way through the refine loop (the seed's queue item)."""

    sample_key: str
    sample: dict[str, Any]
    pytorch_code: str
    messages: list[dict[str, Any]]
    turn_num: int = 1
    turns_history: list[dict[str, Any]] = field(default_factory=list)
    task: Task | None = field(default=None, repr=False)
    env: KernelRefineEnv | None = field(default=None, repr=False)

    @classmethod
    def for_task(cls, task: Task, language: str | None = None, *, max_turns: int = 1,
                 settings: EvalSettings | None = None) -> QueueItem:
        """The item of a task, its conversation opened with the refine prompt (``settings``: those
        its answers will be evaluated with, which the prompt states)."""
        return cls(sample_key=task.id, sample=sample_of(task), pytorch_code=task.code, task=task,
                   messages=build_messages(task, language_and_device(language)[0], max_turns=max_turns,
                                           settings=settings))


class RefineQueue:
    """A passive FIFO of QueueItems: it keeps the line, counts turns, words feedback and builds
    traces. It calls no model and evaluates nothing; the orchestrator does."""

    def __init__(self, max_turns: int = 4, *, language: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.language = get_language(language_and_device(language)[0])
        self.items: deque[QueueItem] = deque()
        self.completed: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: QueueItem) -> None:
        """Put an item at the back of the line."""
        self.items.append(item)

    def pop(self) -> QueueItem | None:
        """The item at the front of the line, or None when the line is empty."""
        return self.items.popleft() if self.items else None

    def should_stop(self, turn_num: int, result: TurnResult | dict) -> tuple[bool, str]:
        """(stop, reason): ``success_fast``, ``max_turns_reached`` or ``continue`` (the env's rule)."""
        return should_stop(turn_num, self.max_turns, result)

    def build_feedback(self, result: TurnResult | dict) -> str:
        """The feedback text for a result (the env's wording, the result's tolerance)."""
        return build_feedback(result, self.language.code_tag)

    def requeue_with_feedback(self, item: QueueItem, feedback: str, completion: str) -> None:
        """Add the answer and its feedback to the conversation; the item goes to the back of the line."""
        item.messages.append({"role": "assistant", "content": completion})
        item.messages.append({"role": "user", "content": feedback})
        item.turn_num += 1
        self.items.append(item)

    def finalize(self, item: QueueItem, reason: StopReason) -> dict[str, Any]:
        """The item's trace (seed format), with the final answer closing ``full_messages``."""
        if item.turns_history:
            item.messages.append({"role": "assistant", "content": item.turns_history[-1]["full_completion"]})
        trace = build_trace(sample_key=item.sample_key, sample=item.sample, pytorch_code=item.pytorch_code,
                            turns=item.turns_history, messages=item.messages, stop_reason=reason,
                            language=self.language.name).model_dump(mode="json")
        self.completed.append(trace)
        return trace


# ============================================================================ the output


class TraceStore:
    """The output: a JSON list of traces, and a journal of the traces finished since it was written.

    ``open`` reads it and folds a crashed run's journal (``kernel_env.workloads.runs.journal``: a torn
    last line is left out, and cut before the next trace is added); ``create`` makes the output when
    a run starts (a run that never started leaves none); ``add`` makes a trace durable (journal
    line, fsync) before it returns; ``fold`` rewrites the JSON list atomically, then drops the journal.
    Files get the umask's mode, or keep the mode of the output they replace."""

    def __init__(self, path: str | Path, *, fold_every: int = 50):
        self.path = Path(path)
        self.journal = Journal(self.path.with_name(self.path.name + ".journal.jsonl"))
        self.fold_every = fold_every
        self.traces: dict[str, dict[str, Any]] = {}
        self._unfolded = 0

    def __enter__(self) -> TraceStore:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.fold()

    def open(self) -> TraceStore:
        """Read the output and any journal; raises GenerateError if the output is not a trace list or
        the journal not a journal."""
        if self.path.exists():
            try:
                existing = json.loads(self.path.read_text() or "[]")
            except (OSError, ValueError) as exc:
                raise GenerateError(f"output {self.path}: cannot read it as JSON ({exc}); move it away or pass "
                                    f"another --output") from None
            if not isinstance(existing, list) or not all(isinstance(t, dict) and "sample_key" in t for t in existing):
                raise GenerateError(f"output {self.path}: not a list of traces (each with a sample_key); move it away "
                                    f"or pass another --output")
            for trace in existing:
                self.traces[trace["sample_key"]] = trace
        try:
            entries = self.journal.read()  # without a torn last line (a crash mid-write): that trace did not finish
        except JournalError as exc:
            raise GenerateError(f"{exc}; move it away to run again") from None
        for entry in entries:
            if "sample_key" in entry.record:
                self.traces[entry.record["sample_key"]] = entry.record
                self._unfolded += 1
        self.fold()
        return self

    def create(self) -> None:
        """The run starts: make the output (an empty list when there is none yet)."""
        if not self.path.exists():
            self._write()

    @property
    def finished(self) -> set[str]:
        return set(self.traces)

    def add(self, trace: dict[str, Any]) -> None:
        """Keep a finished trace: on disk (journal, fsynced) before this returns."""
        self.journal.append(json.dumps(trace, default=str))
        self.traces[trace["sample_key"]] = trace
        self._unfolded += 1
        if self._unfolded >= self.fold_every:
            self.fold()

    def fold(self) -> None:
        """Rewrite the output with every trace, then drop the journal (if a trace came since the last fold)."""
        if self._unfolded:
            self._write()

    def _write(self) -> None:
        """The output, every trace in it, replaced atomically (temp file, fsync, rename); the journal dropped."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = self.path.stat().st_mode & 0o777 if self.path.exists() else None
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        # os.open's mode goes through the umask, as open()'s does (mkstemp's 0600 would not).
        handle = os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w")
        try:
            with handle:
                if mode is not None:
                    os.fchmod(handle.fileno(), mode)
                json.dump(list(self.traces.values()), handle, indent=2, default=str)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self.journal.path.unlink(missing_ok=True)
        self._unfolded = 0


# ============================================================================ sources


def select_tasks(*, kernelbench: str | Path | None = None, kernelbook: str | Path | None = None,
                 tasks: str | Path | None = None, kernelbench_samples: int = 1000, kernelbook_samples: int = 1500,
                 seed: int = 0) -> list[Task]:
    """The samples of a run, from local files: KernelBook records (a JSONL file, at most
    ``kernelbook_samples``), a KernelBench checkout (at most ``kernelbench_samples``), and any
    ``load_tasks`` spec (all of it). A capped source gives a random sample (``seed``), in source
    order. Raises TaskError for a source that cannot be read."""
    selected: list[Task] = []
    if kernelbook is not None:
        path = Path(kernelbook)
        if not path.is_file():
            raise TaskError(f"task source {path}: --kernelbook takes a JSONL file of KernelBook records")
        selected += _sample(load_jsonl(path, source="kernelbook"), kernelbook_samples, seed)
    if kernelbench is not None:
        selected += _sample(load_kernelbench(kernelbench), kernelbench_samples, seed)
    if tasks is not None:
        selected += load_tasks(tasks)
    unique: dict[str, Task] = {}
    for task in selected:
        unique.setdefault(task.id, task)
    return list(unique.values())


def _sample(found: list[Task], count: int, seed: int) -> list[Task]:
    if count >= len(found):
        return found
    chosen = set(random.Random(seed).sample(range(len(found)), count))
    return [task for index, task in enumerate(found) if index in chosen]


# ============================================================================ the orchestrator


@dataclass(frozen=True)
class GenerateConfig:
    """How to run: the server, the loop, and where answers are evaluated.

    ``model`` None takes the server's only model; ``language`` and ``device`` None, the machine's
    (``language_and_device``). ``max_active`` bounds the samples in the line
    at once (default 4 × ``batch_size``). ``settings`` and ``pool`` (a GpuPool, or a kind: "local",
    "ray") go to every KernelRefineEnv."""

    base_url: str = DEFAULT_BASE_URL
    model: str | None = None
    api_key: str = "EMPTY"
    multi_turn: bool = False
    max_turns: int = 4
    batch_size: int = 10
    max_active: int | None = None
    language: str | None = None
    device: str | None = None
    sandbox: str = DEFAULT_SANDBOX
    temperature: float | None = 0.7
    max_tokens: int | None = None
    request_timeout: float = 900.0
    settings: EvalSettings | None = None
    pool: GpuPool | str | None = None

    @property
    def turns(self) -> int:
        """Answers per sample at most: ``max_turns`` with ``multi_turn``, else one."""
        return self.max_turns if self.multi_turn else 1

    @property
    def active_limit(self) -> int:
        return self.max_active or 4 * self.batch_size


@dataclass
class GenerateSummary(RunSummary):
    """What a run did. ``failed`` maps samples that ended without a trace to why, and
    ``evaluator_faults`` those dropped because an evaluation failed by the evaluator's fault (a
    rerun retries both)."""

    written: int = 0
    success_fast: int = 0
    max_turns_reached: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    evaluator_faults: dict[str, str] = field(default_factory=dict)


#: Called after every finished or failed sample: (summary so far, samples in the line, event text).
ProgressCallback = Callable[[GenerateSummary, int, str], None]


async def generate(tasks: Iterable[Task], config: GenerateConfig, store: TraceStore, *,
                   on_progress: ProgressCallback | None = None) -> GenerateSummary:
    """Run the refine loop over ``tasks``. On any exit, interruption included, every live
    workspace is closed and the store folded.

    Args:
        tasks: the samples (``select_tasks``); those already finished in ``store`` are skipped.
        config: the server, the loop, and where answers are evaluated.
        store: the output, opened (``TraceStore.open`` or ``with``); it is made only once the
            server has answered.
        on_progress: called after every finished or dropped sample: (summary so far, samples in
            the line, what happened).

    Returns:
        The summary: traces written by stop reason, samples dropped (``failed``,
        ``evaluator_faults``) with why, and the model and address that answered.

    Raises:
        ServerUnreachable: the server does not answer, before the first sample (nothing is
            written) or in the middle of the run (finished traces are kept).
        GenerateError: samples cannot be set up here (no sandbox, a bad device or pool, a model
            the server does not serve)."""
    tasks = list(tasks)
    try:
        language, device = language_and_device(config.language, config.device)
        check_device(get_language(language), device)
    except (EpisodeError, ValueError) as exc:
        raise GenerateError(str(exc)) from None
    summary = GenerateSummary(selected=len(tasks))
    todo = deque(task for task in tasks if task.id not in store.finished)
    summary.skipped = len(tasks) - len(todo)
    server = await asyncio.to_thread(connect, config.base_url, config.model, api_key=config.api_key,
                                     serve_hint=SERVE_HINT)
    summary.model, summary.base_url = server.model, server.base_url
    config = _with_pool(dataclasses.replace(config, base_url=server.base_url, model=server.model, language=language,
                                            device=device))
    store.create()  # the run starts: only now is the output made
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key=config.api_key, timeout=config.request_timeout,
                                max_retries=2)
    try:
        if todo:
            await _Run(config, client, store, summary, on_progress).run(todo)
    finally:
        await client.close()
    return summary


def _with_pool(config: GenerateConfig) -> GenerateConfig:
    """The config with its pool kind ("local", "ray") replaced by this process's shared pool of that kind."""
    if not isinstance(config.pool, str):
        return config
    try:
        return dataclasses.replace(config, pool=shared_pool(config.pool))
    except (ImportError, ValueError, RuntimeError, OSError) as exc:
        raise GenerateError(f"cannot use the {config.pool!r} evaluation pool: {type(exc).__name__}: {exc}") from None


class _Run:
    """One run of the orchestrator: the line, the live environments, the store."""

    def __init__(self, config: GenerateConfig, client: openai.AsyncOpenAI, store: TraceStore, summary: GenerateSummary,
                 on_progress: ProgressCallback | None):
        self.config, self.client, self.store, self.summary = config, client, store, summary
        self.on_progress = on_progress
        self.queue = RefineQueue(config.turns, language=config.language)
        self.live: list[QueueItem] = []

    async def run(self, todo: deque[Task]) -> None:
        try:
            while todo or self.queue:
                self._admit(todo)
                batch = [self.queue.pop() for _ in range(min(self.config.batch_size, len(self.queue)))]
                await self._round(batch)
        finally:
            for item in self.live:
                _close(item)
            self.live.clear()
            self.store.fold()

    def _admit(self, todo: deque[Task]) -> None:
        """New samples join at the back of the line while fewer than ``active_limit`` are in it."""
        while todo and len(self.live) < self.config.active_limit:
            item = QueueItem.for_task(todo.popleft(), self.config.language, max_turns=self.config.turns,
                                      settings=self.config.settings)
            self.queue.add(item)
            self.live.append(item)

    async def _round(self, batch: list[QueueItem]) -> None:
        """Generate for every item of the batch at once, then evaluate every answer, then route each item."""
        opened = await asyncio.gather(*(self._open(item) for item in batch if item.env is None), return_exceptions=True)
        for problem in opened:
            if problem is not None:
                raise problem
        replies = await asyncio.gather(*(self._ask(item) for item in batch), return_exceptions=True)
        unreachable = next((r for r in replies if isinstance(r, openai.APIConnectionError)
                            and not isinstance(r, openai.APITimeoutError)), None)
        if unreachable is not None:
            raise ServerUnreachable(f"the model server at {self.config.base_url} stopped answering "
                                    f"({why(unreachable)}); finished traces are kept: rerun to resume")
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, (openai.OpenAIError, NoChoices)):
                raise reply
        answered = [(item, reply) for item, reply in zip(batch, replies) if not isinstance(reply, BaseException)]
        steps = await asyncio.gather(*(item.env.astep(reply) for item, reply in answered))
        outcomes = dict(zip((id(item) for item, _ in answered), steps))
        for item, reply in zip(batch, replies):
            if isinstance(reply, BaseException):
                self._drop(item, f"the model call failed: {type(reply).__name__}: {reply}")
            else:
                self._route(item, outcomes[id(item)])

    async def _open(self, item: QueueItem) -> Exception | None:
        """Give the item its environment (a fresh workspace and sandbox). Returns, not raises, what went
        wrong, so that every environment of the batch is either handed to its item or never opened."""
        env = KernelRefineEnv(item.task, language=self.config.language, device=self.config.device,
                              sandbox=self.config.sandbox, pool=self.config.pool, max_turns=self.config.turns,
                              settings=self.config.settings)
        try:
            _, info = await env.areset()
        except (SandboxError, EpisodeError, OSError) as exc:
            return GenerateError(f"task {item.sample_key}: cannot set up its workspace and sandbox: {exc}")
        item.env = env
        if info["messages"] != item.messages:
            return RuntimeError(f"task {item.sample_key}: the environment's prompt differs from the queue's")
        return None

    async def _ask(self, item: QueueItem) -> Any:
        options: dict[str, Any] = {"model": self.summary.model, "messages": item.messages}
        if self.config.temperature is not None:
            options["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            options["max_tokens"] = self.config.max_tokens
        response = await self.client.chat.completions.create(**options)
        if not response.choices:
            raise NoChoices("the server answered with no choices")
        return response.choices[0].message

    def _route(self, item: QueueItem, step: tuple) -> None:
        """Record the turn; finalise the item (trace to the store) or put it back in line with its feedback."""
        feedback, _, terminated, truncated, info = step
        turn = info["turn_record"]
        if turn["result"].get("fault") == "evaluator":
            why = turn["result"].get("error") or "the evaluator failed"
            self.summary.evaluator_faults[item.sample_key] = why
            self._finish(item, f"{item.sample_key}: dropped, the evaluation failed by the evaluator's fault ({why})")
            return
        item.turns_history.append(turn)
        stop, reason = self.queue.should_stop(item.turn_num, turn["result"])
        if stop != (terminated or truncated):
            raise RuntimeError(f"task {item.sample_key}: the queue and the environment disagree on stopping at turn "
                               f"{item.turn_num}")
        if not stop:
            self.queue.requeue_with_feedback(item, feedback, turn["full_completion"])
            return
        trace = self.queue.finalize(item, reason)
        self.store.add(trace)
        self.summary.written += 1
        if reason == "success_fast":
            self.summary.success_fast += 1
        else:
            self.summary.max_turns_reached += 1
        result = turn["result"]
        outcome = f"speed-up {result['speedup']:.2f}x" if result.get("correctness") else \
            f"not correct: {(result.get('error') or 'wrong outputs').splitlines()[0][:160]}"
        self._finish(item, f"{item.sample_key}: {reason} after {item.turn_num} turn(s), {outcome}")

    def _drop(self, item: QueueItem, why: str) -> None:
        self.summary.failed[item.sample_key] = why
        self._finish(item, f"{item.sample_key}: dropped ({why})")

    def _finish(self, item: QueueItem, event: str) -> None:
        _close(item)
        self.live.remove(item)
        if self.on_progress is not None:
            self.on_progress(self.summary, len(self.queue), event)


def _close(item: QueueItem) -> None:
    if item.env is not None:
        item.env.close()
        item.env = None
