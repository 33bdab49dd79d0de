"""verl's agent loop for kernel_env: one KernelAgent-v0 episode per trajectory, on a ``kernel-env serve``
session (OpenEnv's protocol; openenv-core's ``GenericEnvClient``), its tokens from verl's rollout server.

Per trajectory: reset the session with the row's ``task``; render ``[system, the episode's prompt]``
with the chat template and ``tools=info["tools"]`` (kernel_env's OpenAI schemas); then per turn ask
``server_manager.generate`` for tokens (mask 1), read their tool calls with verl's parser for the
model (``actor_rollout_ref.rollout.multi_turn.format``, e.g. ``hermes``), send them as one step,
and append the tool messages' tokens (mask 0). The episode ends it (``Finish``, its ``max_turns``,
or an evaluator's fault); a response budget (``rollout.response_length``) that runs out first ends it
with ``{"truncate": ...}``, so the final evaluation still runs and pays. ``reward_score`` is the sum
of what the steps paid (the final reward; milestones as reached with the server's shaping); the
final evaluation's record and ``fault`` (``"evaluator"``: not the model's doing, drop it) go in
``extra_fields``. The rollout worker needs verl and openenv-core only: sandboxes, builds and
evaluations stay on the server.

Registered as ``kernel_env`` by ``@register`` when imported, and by agent_loop.yaml (verl's
``actor_rollout_ref.rollout.agent.agent_loop_config_path``), which also passes ``server_url``.

Follows verl 0.9.1 (PyPI): ``verl/experimental/agent_loop/agent_loop.py`` (``AgentLoopBase``,
``AgentLoopOutput``, ``register``, ``AgentLoopWorker._run_agent_loop``) and the token bookkeeping of
``verl/experimental/agent_loop/tool_agent_loop.py`` (``ct_build_initial_tokens``,
``ct_merge_assistant_token``, ``ct_merge_context_msg``, the parser's stop tokens).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from openenv.core import GenericEnvClient
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.utils.profiler import simple_timer

#: Why a trajectory ended early, as the episode's record says.
BUDGET_SPENT = "the trajectory's response budget (actor_rollout_ref.rollout.response_length) ran out"


def assistant_message(content: str, calls: list[FunctionCall]) -> dict[str, Any]:
    """The model's turn as a chat message: the history the template renders the tool messages after
    (the turn's own tokens are the model's, already in place)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": call.name, "arguments": _arguments(call)}}
                                 for call in calls]
    return message


def _arguments(call: FunctionCall) -> dict[str, Any] | str:
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError:  # kept as the model wrote it: the episode answers it as an invalid call
        return call.arguments


@register("kernel_env")
class KernelEnvAgentLoop(AgentLoopBase):
    """A KernelAgent-v0 episode on ``kernel-env serve`` (see the module docstring).

    ``server_url``: the server (``kernel-env serve``); ``message_timeout_s``: how long one answer may
    take (a ``Finish`` runs a clean build and the final evaluation, behind the server's queue)."""

    def __init__(self, *args: Any, server_url: str = "http://127.0.0.1:8000", message_timeout_s: float = 1800.0,
                 **kwargs: Any):
        kwargs.pop("tools", None)  # verl's own tool list: kernel_env's tools are the server's
        super().__init__(*args, **kwargs)
        self.server_url = server_url
        self.message_timeout_s = message_timeout_s
        self.tool_parser = ToolParser.get_tool_parser(self.rollout_config.multi_turn.format, self.tokenizer)
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], *, raw_prompt: list[dict[str, Any]], task: str,
                  **kwargs: Any) -> AgentLoopOutput:
        if self.tool_parser.stop_token_ids:  # as ToolAgentLoop: stop after a call so it can be run
            stops = set(sampling_params.get("stop_token_ids") or []) | set(self.tool_parser.stop_token_ids)
            sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
        metrics: dict[str, Any] = {}
        request_id = uuid4().hex
        async with GenericEnvClient(base_url=self.server_url, message_timeout_s=self.message_timeout_s) as env:
            result = await env.reset(task=task)
            tools = result.observation["info"]["tools"]
            messages = [*raw_prompt[:-1], {"role": "user", "content": result.observation["text"]}]
            token_ids = await self.ct_build_initial_tokens(messages, tools=tools)
            mask: list[int] = []
            logprobs: list[float] = []
            paid, replies, answers = 0.0, 0, 0
            while not result.done:
                if len(mask) >= self.response_length:
                    result = await env.step({"truncate": BUDGET_SPENT})
                    paid += result.reward
                    break
                with simple_timer("generate_sequences", metrics):
                    output = await self.server_manager.generate(request_id=request_id, prompt_ids=token_ids,
                                                                sampling_params=sampling_params)
                replies += 1
                merged, mask, logprobs = await self.ct_merge_assistant_token(
                    token_ids, output.token_ids, mask, logprobs if (logprobs or output.log_probs) else None,
                    assistant_logprobs=output.log_probs or None)
                token_ids, logprobs = merged.token_ids, logprobs or []
                if len(mask) >= self.response_length:  # this reply was cut: its calls are not run
                    continue
                content, calls = await self.tool_parser.extract_tool_calls(output.token_ids)
                # A reply with no call the parser could read is stepped as its text: answered as an invalid call.
                action = ([{"name": call.name, "arguments": call.arguments} for call in calls]
                          or [self.tokenizer.decode(output.token_ids, skip_special_tokens=True)])
                with simple_timer("tool_calls", metrics):
                    result = await env.step({"tool_calls": action})
                paid += result.reward
                if result.done:
                    break
                messages.append(assistant_message(content, calls))
                before = list(messages)
                if calls:
                    messages += [{"role": "tool", "content": answer["output"]}
                                 for answer in result.observation["info"]["tool_results"]]
                else:
                    messages.append({"role": "user", "content": result.observation["text"]})
                answers += 1
                merged, mask, logprobs = await self.ct_merge_context_msg(before, messages, token_ids, mask,
                                                                        logprobs or None, tools=tools)
                token_ids, logprobs = merged.token_ids, logprobs or []
        info = result.observation["info"]
        prompt_length = len(token_ids) - len(mask)
        return AgentLoopOutput(
            prompt_ids=token_ids[:prompt_length],
            response_ids=token_ids[prompt_length:][: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=paid,
            num_turns=1 + replies + answers,
            metrics=metrics,
            extra_fields={"fault": info.get("fault"), "final": info.get("final"), "episode_turns": info.get("turn")},
        )
