"""KernelRefine-v0: the seed orchestrator's fixed multi-turn refine loop, as a Gymnasium env.

An action is one model completion: the env extracts its code, writes it into the episode's
workspace, builds and evaluates it as ``python3 -m utils.profiling`` would, and answers with the
seed's feedback. The episode stops on ``success_fast`` (terminated) or ``max_turns_reached``
(truncated); only the last step pays. Prompt, extraction, feedback, reward and trace:
docs/refine.md, KernelRefine-v0.

- ``KernelRefineEnv``: the environment (``step``; ``trace()``, the seed's trace record).
- ``CompletionSpace``: its action space: completions as a model returns them.

Before touching it: what is said and when to stop is the refine protocol
(``refine_protocol.py``), which ``kernel_env.workloads.runs.generate`` shares, checking on every
prompt and stop that it agrees with this env. This module only runs it on an episode: it writes
the answer's files, builds and evaluates them, and keeps the conversation and the trace. ``step``
never raises for anything a model sends.
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
    """KernelRefine-v0 (the module docstring says what it promises).

    Args:
        task, device, sandbox, sandbox_options, pool, kernelbench_root: as ``EpisodeEnv``'s.
        language: as ``EpisodeEnv``'s; its tag is the answer's tag (the seed's traces are
            Triton's: pass language="triton" for them).
        max_turns: answers before the episode is truncated (default 4, the seed's).
        settings: EvalSettings for every evaluation; the prompt and the feedback state its trials
            and tolerance.

    Raises:
        ValueError: as ``EpisodeEnv``.
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
        """Evaluate one completion and answer with feedback.

        Args:
            action: one completion: a str (or UTF-8 bytes), a mapping with ``content`` (and
                ``reasoning_content`` or ``reasoning``), or an OpenAI ``ChatCompletionMessage`` /
                ``ChatCompletion``. Anything else, or an answer without usable code, is answered
                with feedback saying so and counts as a turn; nothing makes ``step`` raise.

        Returns:
            observation (str): the feedback (the seed's wording).
            reward (float): 0 until the last step; then what the final turn's evaluation pays
                (``paid_reward``: -1, 1, 2, 3; -1 for an answer without usable code; 0 for an
                evaluator's fault).
            terminated (bool): ``success_fast``: correct, and at least as fast as eager PyTorch.
            truncated (bool): ``max_turns_reached``.
            info (dict): ``turn``, ``max_turns``, ``messages`` (the chat so far), ``result`` (the
                seed's result record), ``turn_record``, ``evaluation`` and ``report`` (None when
                nothing was evaluated), ``stop_reason``; on the last step also ``fault`` and
                ``trace``. After the end: ``ENDED``, 0.0, the last step's flags."""
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

