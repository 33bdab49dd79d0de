"""The typed client of ``kernel-env serve`` (``kernel_env.integrations.openenv``), in the shape of
OpenEnv's own environments (their ``models.py`` and ``client.py``). The server validates and answers
with these same classes, and the repository's ``openenv.yaml`` names them; docs/trainers.md ("A
trainer's client") shows a rollout with them.

- ``KernelAgentAction``: a KernelAgent-v0 step (tool calls, or ``truncate``);
  ``KernelRefineAction``: a KernelRefine-v0 step (a completion).
- ``KernelEnvObservation``: what a reset or step answers, both environments'.
- ``KernelEnvState``: a session's environment (``await env.state()``).
- ``KernelEnvClient``: openenv-core's ``EnvClient`` over them (``sync()`` for calls without await).
- ``ServerError``: an answer of type "error", with its ``code``; ``ErrorCode``: the codes the
  server adds to openenv-core's.

This module imports openenv-core and pydantic, never kernel_env (nor torch): a rollout worker
with only openenv-core can copy this one file and import it.
"""

from __future__ import annotations

import enum
from typing import Any

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.types import Action, Observation, State
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.openenv_client needs openenv-core ({exc}); "
                              "install it with: pip install 'kernel_env[serve]' (or openenv-core==0.3.0 alone)",
                              name=exc.name) from exc
from pydantic import Field


class KernelAgentAction(Action):
    """A KernelAgent-v0 step: the tool calls of one model turn, run in order; or, with ``truncate``,
    the end of the episode for a budget the trainer keeps (``KernelAgentEnv.truncate``: the final
    evaluation runs and pays as at the turn limit)."""

    tool_calls: list[Any] = Field(default_factory=list,
                                  description="Each call as KernelAgent-v0's step takes it: {\"name\", \"arguments\"}, "
                                              "an OpenAI or Anthropic tool call, or its JSON string.")
    truncate: str | None = Field(default=None, description="End the episode now, for this reason (the trainer's "
                                                           "token or time budget ran out); tool_calls are not run.")

    def payload(self) -> list[Any]:
        """What ``KernelAgentEnv.step`` takes."""
        return self.tool_calls


class KernelRefineAction(Action):
    """A KernelRefine-v0 step: one model completion, with its code in the language's tag or a fenced block."""

    content: str = Field(description="The completion's text.")
    reasoning_content: str | None = Field(default=None,
                                          description="The model's reasoning, where the server split it off.")

    def payload(self) -> dict[str, str]:
        """What ``KernelRefineEnv.step`` takes."""
        return self.model_dump(include={"content", "reasoning_content"}, exclude_none=True)


class KernelEnvObservation(Observation):
    """What a reset or step answers (``reward`` and ``done`` are OpenEnv's: ``done`` is terminated or truncated)."""

    text: str = Field(default="", description="The environment's text: the prompt, the tools' output, the feedback.")
    terminated: bool = Field(default=False, description="The episode ended by the agent (Finish, or a fast solution).")
    truncated: bool = Field(default=False, description="The episode was cut short (the turn limit, an evaluator's "
                                                       "fault: info['fault'] == 'evaluator', drop it from training).")
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's info, whole: the tools' schemas "
                                                                   "at reset; final, fault, evaluations, rollout, ...")


class KernelEnvState(State):
    """A session's environment: its task, where it runs, and whether an episode is open."""

    env: str = Field(description="KernelAgent-v0 or KernelRefine-v0.")
    task_id: str | None = Field(default=None, description="The task of the current (or next) episode.")
    language: str
    device: str
    max_turns: int
    episode_open: bool = Field(default=False, description="An episode holds a sandbox and a workspace.")
    done: bool = Field(default=False, description="The episode has ended.")


class ErrorCode(str, enum.Enum):
    """The codes of the server's refusals, beside openenv-core's own (``WSErrorCode``: CAPACITY_REACHED,
    EXECUTION_ERROR, ...), which a str enum cannot be extended with."""

    #: The session's episode was closed after the server's idle timeout: a reset starts a new one.
    SESSION_IDLE_TIMEOUT = "SESSION_IDLE_TIMEOUT"
    #: The server is draining (SIGTERM): it starts no new episode or step; connect to another server.
    SERVER_DRAINING = "SERVER_DRAINING"


class ServerError(RuntimeError):
    """An answer of type "error": ``code`` (an ``ErrorCode`` value or one of openenv-core's) and
    ``message``. A RuntimeError with openenv-core's text, which its own client raises for one."""

    def __init__(self, message: str, code: str):
        super().__init__(f"Server error: {message} (code: {code})")
        self.message = message
        self.code = code


class KernelEnvClient(EnvClient[KernelAgentAction | KernelRefineAction, KernelEnvObservation, KernelEnvState]):
    """openenv-core's ``EnvClient`` for ``kernel-env serve``: one WebSocket session, its episodes.

    ``reset(task=..., seed=..., episode_id=...)`` (every argument optional), ``step(action)``,
    ``state()``, ``close()``; ``sync()`` for the same without await. Each returns openenv-core's
    ``StepResult`` (``observation``, ``reward``, ``done``), or ``state()`` a ``KernelEnvState``;
    an error answer raises ``ServerError``.

    Args:
        base_url: the server's address (``http://host:8000``; the session is its ``/ws``).
        message_timeout_s: how long to wait for an answer. 900 s, not openenv-core's 60: a Finish
            step rebuilds and runs the final evaluation, which waits for the server's pool.
        **options: openenv-core's ``EnvClient`` options (``connect_timeout_s``, ``max_message_size_mb``, ...)."""

    def __init__(self, base_url: str, *, message_timeout_s: float = 900.0, **options: Any):
        super().__init__(base_url, message_timeout_s=message_timeout_s, **options)

    def _step_payload(self, action: KernelAgentAction | KernelRefineAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[KernelEnvObservation]:
        observation = KernelEnvObservation.model_validate(
            {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> KernelEnvState:
        return KernelEnvState.model_validate(payload)

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """openenv-core's exchange, raising ``ServerError`` (with the code) for an error answer."""
        await self._send(message)
        answer = await self._receive()
        if answer.get("type") == "error":
            data = answer.get("data", {})
            raise ServerError(data.get("message", "unknown error"), data.get("code", "UNKNOWN"))
        return answer


__all__ = ["ErrorCode", "KernelAgentAction", "KernelEnvClient", "KernelEnvObservation", "KernelEnvState",
           "KernelRefineAction", "ServerError"]
