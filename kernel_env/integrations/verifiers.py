"""kernel_env as a ``verifiers`` environment, the shape prime-rl trains on (as a classic, v0,
environment: ``legacy.id = "kernel_env.integrations.verifiers"``) and ``vf-eval`` runs. Each rollout
is one KernelAgent-v0 episode with kernel_env's tools in its sandbox, paid what the trusted final
evaluation pays (``paid_reward``). docs/trainers.md ("prime-rl") shows its use and how each of
verifiers' concepts maps.

- ``load_environment``: the environment over a task source, what ``vf.load_environment`` calls.
- ``KernelEnv``: the ``vf.MultiTurnEnv`` (verifiers' classic API: 0.3 has it, 0.4 does not).
- ``kernel_env_reward``, ``correct``, ``invalid_calls``: the rubric's reward and metrics.

Only the episode ends a rollout (``Finish`` or its ``max_turns``): verifiers' own turn limit is off,
since its check runs before ``env_response`` and the last reply's calls would never run. A rollout
verifiers stops for a budget is truncated, so its final evaluation still runs and pays. An
evaluator's fault, a sandbox or pool failure, sets the rollout's ``error`` (an ``InfraError``),
which prime-rl reschedules rather than trains on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

try:
    import verifiers as vf
    from datasets import Dataset
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.verifiers needs verifiers ({exc}); "
                              "install it with: pip install 'kernel_env[verifiers]'", name=exc.name) from exc
if not hasattr(vf, "MultiTurnEnv"):
    raise ImportError(f"kernel_env.integrations.verifiers needs verifiers' classic API (verifiers 0.3), which "
                      f"verifiers {vf.__version__} does not have: pip install 'kernel_env[verifiers]'")

from kernel_env.envs.agent import KernelAgentEnv
from kernel_env.evaluators.records import EvalSettings
from kernel_env.tasks import Task, load_tasks, resolve_task
from kernel_env.tools import tool_schemas
from kernel_env.workloads.runs.agent_eval import NUDGE, SYSTEM_PROMPT

T = TypeVar("T")


def load_environment(tasks: str | Iterable[Task | str] = "examples", *, system_prompt: str = SYSTEM_PROMPT,
                     settings: EvalSettings | dict[str, Any] | None = None, kernelbench_root: str | None = None,
                     **options: Any) -> KernelEnv:
    """The verifiers environment over ``tasks``, one dataset row per task::

        env = vf.load_environment("kernel_env.integrations.verifiers", tasks="examples", language="cpp", device="cpu")

    Args:
        tasks: a source for ``load_tasks`` ("examples", a KernelBench checkout, a record file or
            folder), or a list of Tasks and task specs (``resolve_task``'s).
        system_prompt: the rollouts' system message (default: ``kernel-env eval``'s).
        settings: the evaluation protocol, an ``EvalSettings`` or a dict of its fields (as a TOML
            config gives it).
        kernelbench_root: the KernelBench checkout for ``kernelbench/...`` specs.
        **options: every episode's ``KernelAgentEnv`` options (language, device, sandbox,
            sandbox_options, pool, max_turns, selection, shaping, reward_kind, tools,
            max_output_chars), checked here rather than at the first rollout.

    Returns:
        The environment (``KernelEnv``).

    Raises:
        TaskError: a source or spec that names no task.
        ValueError: no tasks; a bad option (what ``KernelAgentEnv`` raises) or settings value.
        TypeError: an unknown option."""
    if isinstance(tasks, str):
        tasks = load_tasks(tasks)
    else:
        tasks = [task if isinstance(task, Task) else resolve_task(task, kernelbench_root=kernelbench_root)
                 for task in tasks]
    if isinstance(settings, dict):
        settings = EvalSettings(**settings)
    return KernelEnv(tasks, system_prompt=system_prompt,
                     agent_options={**options, "settings": settings, "kernelbench_root": kernelbench_root})


def kernel_env_reward(state: vf.State) -> float:
    """What the episode paid in all (KernelAgent-v0's return: the final reward)."""
    return state.get("kernel_env_return", 0.0)


def correct(state: vf.State) -> float:
    """1 when the final evaluation found the solution correct."""
    final = (state.get("kernel_env_info") or {}).get("final") or {}
    return float(bool(final.get("correct")))


def invalid_calls(state: vf.State) -> float:
    """Tool calls the episode could not run as given (unparseable, an unknown tool, bad arguments)."""
    return float((state.get("kernel_env_info") or {}).get("invalid_calls", 0))


class KernelEnv(vf.MultiTurnEnv):
    """KernelAgent-v0 episodes as verifiers rollouts (docs/trainers.md says how they map).

    ``tasks`` are the dataset's rows, in order; ``agent_options`` go to each episode's
    ``KernelAgentEnv`` and ``kwargs`` to ``vf.MultiTurnEnv`` (``timeout_seconds``, ``max_seq_len``, ...)."""

    def __init__(self, tasks: list[Task], *, agent_options: dict[str, Any] | None = None,
                 system_prompt: str = SYSTEM_PROMPT, **kwargs: Any):
        if not tasks:
            raise ValueError("no tasks: the environment needs at least one")
        self.tasks = {task.id: task for task in tasks}
        self.agent_options = dict(agent_options or {})
        KernelAgentEnv(**self.agent_options)  # a bad option fails here, not in every rollout
        rows = [{"prompt": [{"role": "user", "content": f"# Task {task.id}"}], "info": {"task_id": task.id}}
                for task in tasks]
        rubric = vf.Rubric(funcs=[kernel_env_reward])
        rubric.add_metric(correct)
        rubric.add_metric(invalid_calls)
        super().__init__(dataset=Dataset.from_list(rows), system_prompt=system_prompt, rubric=rubric,
                         tool_defs=[spec["function"] for spec in tool_schemas(self.agent_options.get("tools"))],
                         max_turns=-1, **kwargs)

    async def setup_state(self, state: vf.State, **kwargs: Any) -> vf.State:
        """Open the rollout's episode; its prompt becomes the rollout's user message."""
        state["kernel_env_return"] = 0.0
        state["kernel_env"] = env = KernelAgentEnv(self.tasks[state["info"]["task_id"]], **self.agent_options)
        try:
            prompt, state["kernel_env_info"] = await self._in_flight(state, env.areset())
        except Exception as exc:  # no sandbox, no pool: the environment's failure, not the model's
            raise vf.InfraError(f"the kernel_env episode could not start: {type(exc).__name__}: {exc}") from exc
        state["prompt"] = [*state["prompt"][:-1], vf.UserMessage(content=prompt)]
        return await super().setup_state(state, **kwargs)

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        """Step the episode with the last assistant message's tool calls (or its text)."""
        reply = messages[-1]
        calls = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in reply.tool_calls or []]
        try:
            observation, ended = await self._in_flight(state, self._step(state, calls or reply.content or ""))
        except Exception as exc:  # the sandbox or the pool failed; the agent cannot make step raise
            raise vf.InfraError(f"the kernel_env episode failed: {type(exc).__name__}: {exc}") from exc
        if calls:
            response = [vf.ToolMessage(tool_call_id=call["id"], content=result["output"])
                        for call, result in zip(calls, state["kernel_env_info"]["tool_results"], strict=True)]
        else:
            response = [vf.UserMessage(content=f"{observation}\n\n{NUDGE}")]
        if ended:
            state["final_env_response"] = response
        return response

    @vf.cleanup
    async def end_episode(self, state: vf.State) -> None:
        """Close the episode; one that verifiers stopped first (a budget, not an error) is
        truncated, so its final evaluation runs and pays. An evaluator's fault becomes the error."""
        env: KernelAgentEnv | None = state.get("kernel_env")
        if env is None:
            return
        try:
            await asyncio.wait([state["kernel_env_call"]])
            if not env.done and state.get("error") is None:
                reason = f"The rollout was stopped ({state.get('stop_condition') or 'by the trainer'})."
                _, reward, _, _, info = await env.atruncate(reason)
                self._pay(state, reward, info)
            if (state.get("kernel_env_info") or {}).get("fault") == "evaluator":
                final = state["kernel_env_info"]["final"]
                state["error"] = vf.InfraError(f"the final evaluation failed by the evaluator's fault: {final['error']}")
        finally:
            await asyncio.to_thread(env.close)

    @staticmethod
    async def _in_flight(state: vf.State, call: Awaitable[T]) -> T:
        """Run an episode's reset or step as a task of its own: a rollout that verifiers cancels
        (its timeout) leaves it running, and ``end_episode`` waits for it before anything else."""
        state["kernel_env_call"] = task = asyncio.ensure_future(call)
        return await asyncio.shield(task)

    async def _step(self, state: vf.State, action: Any) -> tuple[str, bool]:
        observation, reward, terminated, truncated, info = await state["kernel_env"].astep(action)
        self._pay(state, reward, info)
        return observation, terminated or truncated

    @staticmethod
    def _pay(state: vf.State, reward: float, info: dict[str, Any]) -> None:
        """Keep the episode's latest info and add a payment to its return and to the last turn."""
        state["kernel_env_info"] = info
        state["kernel_env_return"] += reward
        if state["trajectory"]:
            turn = state["trajectory"][-1]
            turn["reward"] = (turn["reward"] or 0.0) + reward


__all__ = ["KernelEnv", "correct", "invalid_calls", "kernel_env_reward", "load_environment"]
