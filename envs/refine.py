"""KernelRefine-v0: the fixed multi-turn refine loop of the seed orchestrator, as a Gymnasium env.

::

    env = kernel_env.make("KernelRefine-v0", task="example/relu_add", language="triton", device="cpu")
    prompt, info = env.reset()                  # info["messages"]: [system, user] (OpenAI chat format)
    feedback, reward, terminated, truncated, info = env.step(completion)

An action is one model completion: a str, a dict with ``content`` (and optionally
``reasoning_content``), or an OpenAI ``ChatCompletionMessage`` (or ``ChatCompletion``). The env
extracts the code (the language's tag, ``<triton>…</triton>`` for Triton, else the last fenced
code block), writes it into the episode's workspace (model_new.py, or every ``<file path=…>``
element), builds it in the sandbox and evaluates it through the pool exactly as an agent's
``python3 -m utils.profiling`` would, and answers with the seed's feedback: the error, how the
output mismatched, ``{speedup:.2f}x PyTorch`` (speed-up over eager PyTorch) with a request to
optimise, or success. Nothing a model sends makes ``step`` raise: an answer without usable code
is told so, and counts as a turn.

The episode stops on ``success_fast`` (correct and speed-up ≥ 1.0: terminated) or
``max_turns_reached`` (truncated). Reward is 0 on every other step and, on the last, what the
final turn's evaluation pays (``paid_reward``: the milestone the harness recorded, CUDA Agent
eq. 1: -1, 1, 2, 3; -1 for an answer without usable code). The last step's ``info["trace"]``
(and ``trace()``) is the seed orchestrator's trace record, ready for SFT.

What is said and when to stop is the refine protocol (``refine_protocol.py``), which
``kernel_env.workloads.runs.generate`` shares; this module only runs it on an episode: it writes the
answer's files, builds and evaluates them, and keeps the conversation and the trace.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.envs.common import ENDED, EpisodeEnv, ModelOutputSpace, TextSpace
from kernel_env.envs.refine_protocol import (
    MODEL_NEW,
    Extracted,
    StopReason,
    Trace,
    Turn,
    TurnResult,
    build_feedback,
    build_messages,
    build_trace,
    extract_code,
    parse_completion,
    sample_of,
    should_stop,
)
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode
from kernel_env.evaluators.report import model_report
from kernel_env.runtime.pool import GpuPool
from kernel_env.sandbox import SandboxError
from kernel_env.tasks import Task

MAX_OBSERVATION_CHARS = 1_000_000


class CompletionSpace(ModelOutputSpace):
    """Model completions: a str, a message mapping, or an OpenAI message object.

    ``sample()`` gives a completion without code: stepping it is cheap (no build, no evaluation)
    and is answered with feedback saying so, which is what checkers and smoke tests need."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, (str, bytes, Mapping)) or hasattr(x, "content") or hasattr(x, "choices")

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return "I will think about the kernel design before writing any code."


class KernelRefineEnv(EpisodeEnv):
    """See the module docstring. Keyword arguments (``EpisodeEnv`` says more of the shared ones):

    task          a Task, or a spec for ``resolve_task``; ``reset(options={"task": ...})`` switches task
    language      cuda | cpp | triton (default: cuda where a GPU is visible, else cpp); its tag is the
                  answer's tag (the seed's traces are Triton's: pass language="triton" for them)
    device        where the trusted harness runs: cuda | cpu (default: cuda where a GPU is visible)
    sandbox       sandbox backend: "local" (default) or "docker", with ``sandbox_options``
    pool          a GpuPool, or a pool kind ("local", "ray"); default: the shared local pool
    max_turns     answers before the episode is truncated (default 4, the seed's)
    settings      EvalSettings for every evaluation; the prompt and the feedback state its trials
                  and tolerance
    """

    def __init__(self, task: Task | str | None = None, *, language: str | None = None, device: str | None = None,
                 sandbox: str = DEFAULT_SANDBOX, sandbox_options: dict[str, Any] | None = None,
                 pool: GpuPool | str | None = None, max_turns: int = 4, settings: EvalSettings | None = None,
                 kernelbench_root: str | None = None):
        super().__init__(task, language=language, device=device, sandbox=sandbox, sandbox_options=sandbox_options,
                         pool=pool, max_turns=max_turns, settings=settings, kernelbench_root=kernelbench_root)
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.action_space = CompletionSpace()

    def _reset_state(self) -> None:
        super()._reset_state()
        self.stop_reason: StopReason | None = None
        self.turns: list[Turn] = []
        self.messages: list[dict[str, Any]] = []
        self.evaluations: list[EvalResult] = []

    # ------------------------------------------------------------------ gymnasium API

    def _start(self) -> tuple[str, dict[str, Any]]:
        """The prompt (system and user text); ``info["messages"]`` holds them as chat messages."""
        self.messages = build_messages(self.task, self.lang, max_turns=self.max_turns, settings=self.settings)
        observation = "\n\n".join(m["content"] for m in self.messages)
        info = {"task_id": self.task.id, "language": self.language, "device": self.device, "max_turns": self.max_turns,
                "turn": 0, "messages": self._messages(), "workspace_host_path": str(self.episode.workspace.path)}
        return observation, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Evaluate one completion and answer with feedback; never raises for anything a model sends."""
        if self.done or self.episode is None:
            return ENDED, 0.0, self.stop_reason == "success_fast", self.stop_reason == "max_turns_reached", \
                {"turn": self.turn, "max_turns": self.max_turns, "messages": self._messages()}
        self.turn += 1
        completion = parse_completion(action)
        extracted = extract_code(completion.content, self.lang) if completion.problem is None else \
            Extracted(None, None, completion.problem)
        evaluation = None
        if extracted.files is None:
            result = TurnResult.bad_answer(extracted.problem or "no code found")
        else:
            result, evaluation = self._evaluate(extracted.files)
        stop, reason = should_stop(self.turn, self.max_turns, result)
        feedback = build_feedback(result, self.lang.code_tag)
        self.turns.append(Turn(turn=self.turn, thinking=extracted.thinking, model_reasoning=completion.reasoning,
                               triton_code=extracted.code, full_completion=completion.content,
                               feedback_given=None if stop else feedback, result=result))
        self.messages.append({"role": "assistant", "content": completion.content})
        if not stop:
            self.messages.append({"role": "user", "content": feedback})
        info: dict[str, Any] = {
            "turn": self.turn, "max_turns": self.max_turns, "messages": self._messages(),
            "result": result.model_dump(mode="json"), "turn_record": self.turns[-1].model_dump(mode="json"),
            "evaluation": evaluation.summary() if evaluation is not None else None,
            "report": model_report(evaluation) if evaluation is not None else None,
            "stop_reason": reason if stop else None,
        }
        reward = 0.0
        if stop:
            self.done, self.stop_reason = True, reason
            reward = result.reward  # 0 for an evaluator's fault (paid_reward), never -1
            info["fault"] = result.fault
            info["trace"] = self.trace().model_dump(mode="json")
        return feedback, reward, stop and reason == "success_fast", stop and reason == "max_turns_reached", info

    def trace(self) -> Trace:
        """The episode's trace so far (``stop_reason`` is None while it runs)."""
        if self.task is None:
            raise ValueError("no task: the environment has not been reset")
        return build_trace(sample_key=self.task.id, sample=sample_of(self.task), pytorch_code=self.task.code,
                           turns=self.turns, messages=self.messages, stop_reason=self.stop_reason, language=self.language)

    # ------------------------------------------------------------------ one answer

    def _evaluate(self, files: dict[str, str]) -> tuple[TurnResult, EvalResult | None]:
        """Make the agent's files exactly ``files``, build and profile them as utils.profiling would."""
        try:
            self._sync_files(files)
            _, evaluation = self.episode.build_and_evaluate(Mode.PROFILE)
        except SandboxError as exc:
            return TurnResult(status="error", error=f"the sandbox could not take the code: {exc}"), None
        self.evaluations.append(evaluation)
        return TurnResult.from_eval(evaluation), evaluation

    def _sync_files(self, files: dict[str, str]) -> None:
        """Remove agent files the answer does not hold and write those that changed. Unchanged files
        keep their modification times, so an incremental build recompiles only what changed."""
        box = self.episode.sandbox
        workdir = box.workdir.rstrip("/") + "/"
        present = {info.path.removeprefix(workdir) for info in box.glob("kernels/**") if not info.is_dir}
        if box.stat(MODEL_NEW) is not None:
            present.add(MODEL_NEW)
        stale = sorted(present - files.keys())
        if stale:
            box.exec("rm -f -- " + " ".join(shlex.quote(path) for path in stale), timeout=60)
        for path, text in files.items():
            data = text.encode()
            if path in present and box.read_bytes(path) == data:
                continue
            box.write_bytes(path, data)

    def _messages(self) -> list[dict[str, Any]]:
        return [dict(message) for message in self.messages]

