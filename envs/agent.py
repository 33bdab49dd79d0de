"""KernelAgent-v0: an agent's tool calls in a sandboxed workspace, paid by the trusted harness.

An action is one tool call, or a list of them run in order; the observation is the tools' output.
The episode ends with ``Finish`` (terminated), at ``max_turns`` or ``truncate(reason)``
(truncated); then the solution is rebuilt from scratch and evaluated, and what that evaluation
pays is the reward. Rewards, faults and accounting: docs/design.md, Environments.

- ``KernelAgentEnv``: the environment (``step``, ``truncate`` / ``atruncate``, ``rollout``).
- ``ToolCallSpace``: its action space: tool calls as a model emits them.
- ``Rollout``: where an episode's calls and time went (``info["rollout"]``).

Before touching it: ``step`` never raises for anything the agent sends (a malformed call is
answered as error text). This module decides when a reward is paid, never how much a result is
worth (that is ``paid_reward``'s); with ``shaping="milestones"`` the total is still the final
reward. An evaluator's fault is never paid: the episode ends truncated, nothing settled.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.envs.common import ENDED, EpisodeEnv, ModelOutputSpace, TextSpace, in_thread
from kernel_env.evaluators.records import EvalResult, EvalSettings
from kernel_env.evaluators.report import model_report
from kernel_env.evaluators.reward import RewardKind, paid_reward
from kernel_env.resources import skill_file
from kernel_env.runtime.episode import Selection
from kernel_env.runtime.pool import GpuPool
from kernel_env.tasks import Task
from kernel_env.tools import ToolBox, ToolCall, ToolResult, parse_tool_calls

MAX_OBSERVATION_CHARS = 200_000


class ToolCallSpace(ModelOutputSpace):
    """Tool calls as a model emits them: a dict, a JSON string, or a list of either.

    ``sample()`` gives a harmless call (reading a file, listing files), for checkers and smoke tests."""

    _SAMPLES = (
        {"name": "Read", "arguments": {"file_path": "model.py"}},
        {"name": "Read", "arguments": {"file_path": "SKILL.md", "limit": 20}},
        {"name": "Glob", "arguments": {"pattern": "utils/*"}},
    )

    def contains(self, x: Any) -> bool:
        return isinstance(x, (str, bytes, dict, list, tuple))

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, Any]:
        return dict(self._SAMPLES[int(self.np_random.integers(len(self._SAMPLES)))])


class KernelAgentEnv(EpisodeEnv):
    """KernelAgent-v0 (the module docstring says what it promises).

    Args:
        task, language, device, sandbox, sandbox_options, pool, settings, kernelbench_root: as
            ``EpisodeEnv``'s.
        max_turns: steps before the episode is truncated (the paper: 150 training, 200 evaluation).
        selection: which solution counts: "best" (the best one the harness saw during the episode,
            the paper's choice) or "final" (the one in the workspace at the end).
        shaping: None (the reward on the last step) or "milestones" (each new milestone when an
            evaluation first reaches it, the rest settled on the last step; same total).
        reward_kind: what ``paid_reward`` pays for a result: "milestone" (CUDA Agent eq. 1: -1, 1,
            2, 3) or "speedup" (t_compile / t, -1 if incorrect).
        tools: the tool names offered (default: all, Finish included).
        max_output_chars: cap on each tool result's text.

    Raises:
        ValueError: an unknown selection, shaping or reward kind; shaping without
            reward_kind="milestone"; and what ``EpisodeEnv`` raises.
    """

    def __init__(self, task: Task | str | None = None, *, language: str | None = None, device: str | None = None,
                 sandbox: str = DEFAULT_SANDBOX, sandbox_options: dict[str, Any] | None = None,
                 pool: GpuPool | str | None = None, max_turns: int = 150,
                 selection: Selection = "best", shaping: Literal["milestones"] | None = None,
                 reward_kind: str = "milestone", settings: EvalSettings | None = None,
                 tools: list[str] | None = None, max_output_chars: int = 30_000, kernelbench_root: str | None = None):
        if selection not in ("best", "final"):
            raise ValueError(f"selection must be 'best' or 'final', got {selection!r}")
        if shaping not in (None, "milestones"):
            raise ValueError(f"shaping must be None or 'milestones', got {shaping!r}")
        self.reward_kind = RewardKind(reward_kind)
        if shaping and self.reward_kind is not RewardKind.MILESTONE:
            raise ValueError("shaping='milestones' needs reward_kind='milestone'")
        self.selection, self.shaping = selection, shaping
        self.tool_names = tools
        self.max_output_chars = max_output_chars
        self.toolbox: ToolBox | None = None
        super().__init__(task, language=language, device=device, sandbox=sandbox, sandbox_options=sandbox_options,
                         pool=pool, max_turns=max_turns, settings=settings, kernelbench_root=kernelbench_root)
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.action_space = ToolCallSpace()

    def _reset_state(self) -> None:
        super()._reset_state()
        self.rollout = Rollout()
        self.paid = 0.0
        self.final: EvalResult | None = None
        self._seen_results = 0
        self._answered = time.monotonic()  # when the agent last got an observation

    @property
    def invalid_calls(self) -> int:
        return self.rollout.invalid_calls

    # ------------------------------------------------------------------ gymnasium API

    def _start(self) -> tuple[str, dict[str, Any]]:
        """The task prompt: model.py, SKILL.md, the tools; ``info["tools"]`` holds their schemas."""
        self.toolbox = ToolBox(self.episode.sandbox, self.tool_names, max_output_chars=self.max_output_chars)
        info = {
            "task_id": self.task.id, "language": self.language, "device": self.device,
            "workspace_host_path": str(self.episode.workspace.path), "tools": self.toolbox.schemas(),
            "max_turns": self.max_turns, "turn": 0,
        }
        self._answered = time.monotonic()
        return self._prompt(), info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the action's tool calls in order; at the episode's end, the final evaluation.

        Args:
            action: one tool call (``{"name", "arguments"}``, an OpenAI or Anthropic tool call, or
                a JSON string of one) or a list of them. Nothing in it makes ``step`` raise: a
                malformed call is answered as error text and counted in ``info["invalid_calls"]``.

        Returns:
            observation (str): the tools' output (several results each under a header naming its
                tool); on the last step the final evaluation's report follows.
            reward (float): 0, or with ``shaping`` what new milestones add; on the last step what the
                final evaluation settles (``paid_reward`` less what was paid before).
            terminated (bool): ``Finish`` was called.
            truncated (bool): the turn limit was reached, or the final evaluation failed by the
                evaluator's fault (then nothing is settled, and a trainer should drop the episode).
            info (dict): ``turn``, ``max_turns``, ``invalid_calls``, ``tool_results``,
                ``evaluations`` (every trusted evaluation so far), ``task_id``; on the last step
                also ``final``, ``final_report``, ``fault`` ("candidate", "evaluator" or None) and
                ``rollout``. After the end: ``ENDED``, 0.0, terminated."""
        if self.done or self.episode is None:
            return ENDED, 0.0, True, False, self._info([])
        self.rollout.model_s += time.monotonic() - self._answered
        self.turn += 1
        results: list[ToolResult] = []
        finished = False
        for call in parse_tool_calls(action):
            if finished:
                results.append(ToolResult(output="not run: Finish was called earlier in this action", is_error=True,
                                          tool=call.name, call_id=call.id))
                continue
            with self._timed(build=call.name == "Bash" and bool(_BUILD.search(str(call.arguments.get("command"))))):
                result = self.toolbox.run(call)
            self.rollout.count(call, result)
            results.append(result)
            finished = result.tool == "Finish" and not result.is_error
        truncated = not finished and self.turn >= self.max_turns
        ending = f"The turn limit ({self.max_turns}) was reached." if truncated else None
        return self._answer(_render(results), results, finished=finished, ending=ending)

    def truncate(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the episode now, as the turn limit does, for a budget the trainer keeps (the
        context's tokens, wall time): the final evaluation runs and pays as at any end.

        Args:
            reason: the text that ends the observation ("The context budget ... was reached.").

        Returns:
            As ``step``'s last step, truncated; after the end, as ``step`` answers then."""
        if self.done or self.episode is None:
            return ENDED, 0.0, True, False, self._info([])
        self.rollout.model_s += time.monotonic() - self._answered
        return self._answer("", [], finished=False, ending=reason)

    async def atruncate(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``truncate`` on a step thread, as ``astep``."""
        return await in_thread(functools.partial(self.truncate, reason))

    def _answer(self, observation: str, results: list[ToolResult], *, finished: bool,
                ending: str | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """A step's answer: the shaped reward so far; at the end (``finished``, or ``ending`` says
        why the episode is cut short) the final evaluation, what it settles, and the report."""
        truncated = ending is not None
        reward = self._shaped_reward()
        if finished or truncated:
            with self._timed(build=False):
                self.final = self.episode.final_evaluation(self.selection)
            self.done = True
            observation = "\n\n".join(filter(None, [observation, model_report(self.final)]))
            if self.final.fault == "evaluator":
                # Not the agent's ending: the evaluator failed (twice). Nothing is settled, and the
                # episode is truncated, so a trainer drops it rather than learn from a wrong -1.
                finished, truncated = False, True
            else:
                settle = paid_reward(self.final, self.reward_kind) - self.paid  # the episode's total is the final reward
                reward += settle
                self.paid += settle
            if ending:
                observation = f"{observation}\n\n{ending}"
        info = self._info(results)
        self._answered = time.monotonic()
        return observation[-MAX_OBSERVATION_CHARS:], reward, finished, truncated, info

    @contextlib.contextmanager
    def _timed(self, *, build: bool) -> Iterator[None]:
        """Account the time of what runs inside: the trusted evaluations it waited for, the
        episode's own builds (the final clean rebuilds), the rest to builds when ``build`` (a Bash
        call that runs the build) or else to tools."""
        broker, episode = self.episode.broker, self.episode
        started, evaluations, builds = time.monotonic(), broker.evaluation_s, episode.build_s
        try:
            yield
        finally:
            waited = broker.evaluation_s - evaluations
            built = episode.build_s - builds
            rest = max(0.0, time.monotonic() - started - waited - built)
            self.rollout.evaluations_s += waited
            self.rollout.builds_s += built + (rest if build else 0.0)
            self.rollout.tools_s += 0.0 if build else rest

    def _close_episode(self) -> None:
        super()._close_episode()
        self.toolbox = None

    # ------------------------------------------------------------------ rewards

    def _shaped_reward(self) -> float:
        """With shaping: what the evaluations since the last step add to the best milestone paid so far."""
        results = self.episode.results
        new, self._seen_results = results[self._seen_results:], len(results)
        if not self.shaping or not new:
            return 0.0
        best = max(paid_reward(result, self.reward_kind) for result in new)
        payment = max(0.0, best - self.paid)
        self.paid += payment
        return payment

    # ------------------------------------------------------------------ observation and info

    def _prompt(self) -> str:
        task, language = self.task, self.language
        workdir = "/workspace" if getattr(self.episode.sandbox, "isolated", True) else "the workspace"
        tools = "\n".join(f"- {spec['function']['name']}: {spec['function']['description'].splitlines()[0]}"
                          for spec in self.toolbox.schemas())
        return (
            f"# Task {task.id}\n\n"
            f"Make the PyTorch model below faster by writing `ModelNew` in model_new.py with {language} kernels in "
            f"kernels/. You work in {workdir} (your current directory), which holds SKILL.md, the reference model.py, "
            f"the build and evaluation scripts in utils/, and a starter model_new.py. Follow SKILL.md.\n\n"
            f"## The reference (model.py)\n\n```python\n{task.code.rstrip()}\n```\n\n"
            f"## SKILL.md\n\n{skill_file(language).read_text().rstrip()}\n\n"
            f"## Tools\n\n{tools}\n\n"
            f"You have {self.max_turns} turns. When kernels/ and model_new.py hold your final solution, call Finish: "
            f"the solution is then rebuilt and evaluated by the trusted harness, and that evaluation is your result."
        )

    def _info(self, results: list[ToolResult]) -> dict[str, Any]:
        info: dict[str, Any] = {
            "turn": self.turn, "max_turns": self.max_turns, "invalid_calls": self.invalid_calls,
            "tool_results": [r.model_dump(include={"tool", "call_id", "output", "is_error", "data"}) for r in results],
            "evaluations": [r.summary() for r in self.episode.results] if self.episode else [],
        }
        if self.task is not None:
            info["task_id"] = self.task.id
        if self.final is not None:
            info["final"] = self.final.summary()
            info["final_report"] = model_report(self.final)
            info["fault"] = self.final.fault
            info["rollout"] = self.rollout.summary()
        return info


#: A Bash command that runs the workspace's build (its time is accounted to builds).
_BUILD = re.compile(r"compile\.sh|utils[./]build")


@dataclass
class Rollout:
    """Where an episode's calls and time went, for a trainer's accounting and filters
    (``info["rollout"]`` at the episode's end; ``env.rollout`` at any time): the calls by tool;
    ``tool_errors``, valid calls that failed (a missing file, a refused path); ``invalid_calls``,
    calls that could not be run as given (unparseable, an unknown tool, bad arguments);
    ``repeated_calls``, calls that repeat an earlier call of the episode and got the same output
    (a loop that makes no progress). The seconds: ``model``, the agent's time between an
    observation and its next action (the model's generation, for a trainer's rollout loop);
    ``evaluations``, waiting for trusted evaluations (the pool's queue included; one the agent
    runs in the background overlaps the others); ``builds``, the agent's build commands and the
    final clean rebuilds; ``tools``, the rest of the steps."""

    tool_calls: Counter[str] = field(default_factory=Counter)
    tool_errors: int = 0
    invalid_calls: int = 0
    repeated_calls: int = 0
    model_s: float = 0.0
    tools_s: float = 0.0
    builds_s: float = 0.0
    evaluations_s: float = 0.0
    _seen: set[str] = field(default_factory=set)

    def count(self, call: ToolCall, result: ToolResult) -> None:
        self.tool_calls[result.tool or call.name or "(unparsed)"] += 1
        self.invalid_calls += result.invalid_call
        self.tool_errors += result.is_error and not result.invalid_call
        seen = hashlib.sha256(json.dumps([call.name, call.arguments, result.output], sort_keys=True,
                                         default=str).encode()).hexdigest()
        self.repeated_calls += seen in self._seen
        self._seen.add(seen)

    def summary(self) -> dict[str, Any]:
        return {"tool_calls": dict(self.tool_calls), "tool_errors": self.tool_errors,
                "invalid_calls": self.invalid_calls, "repeated_calls": self.repeated_calls,
                "time_s": {"model": round(self.model_s, 3), "tools": round(self.tools_s, 3),
                           "builds": round(self.builds_s, 3), "evaluations": round(self.evaluations_s, 3)}}


def _render(results: list[ToolResult]) -> str:
    """One result as its own text; several, each under a header naming the tool."""
    if len(results) == 1:
        return results[0].output
    return "\n\n".join(f"[{i}] {r.tool or 'invalid call'}{' (error)' if r.is_error else ''}:\n{r.output}"
                       for i, r in enumerate(results, start=1))
