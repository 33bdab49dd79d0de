"""kernel_env as a skyrl-gym environment, the shape SkyRL trains on: ``kernel_agent`` is one
KernelAgent-v0 episode behind skyrl-gym's text-in / text-out ``BaseTextEnv``, rewarded by the
trusted final evaluation. Importing this module registers it with skyrl-gym::

    import skyrl_gym
    import kernel_env.integrations.skyrl as kernel_skyrl

    rows = kernel_skyrl.dataset_rows(kernel_env.load_tasks("examples"))  # SkyRL's data set (save as Parquet)
    env = skyrl_gym.make("kernel_agent", env_config={"language": "cpp", "device": "cpu"}, extras=rows[0])
    prompt, _ = env.init(rows[0]["prompt"])
    out = env.step('<tool_call>{"name": "Read", "arguments": {"file_path": "model.py"}}</tool_call>')

In SkyRL: ``environment.env_class=kernel_agent``, KernelAgentEnv's options under
``environment.skyrl_gym.kernel_agent`` (language, device, sandbox, pool, selection, reward_kind,
settings, ...), and this module imported where the generator makes its environments.

Why KernelAgent-v0 and not KernelRefine-v0: the refine loop's text shape (a completion in, feedback
out) fits ``BaseTextEnv`` with no parsing at all, but it is the loop that makes SFT data; the
environment an agent is trained in is KernelAgent-v0's, tools in a sandbox. SkyRL hands ``step``
the model's decoded text, so the tool calls are read from it: every ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` block after the reasoning (the Hermes format that Qwen2.5 / Qwen3
chat templates render and vLLM's ``hermes`` parser reads). SkyRL renders the prompt without the
tools, so the system message of ``dataset_rows`` describes them in that format.

The mapping (docs/trainers.md says where SkyRL's generator cannot carry the rest):

- A data-set row (``dataset_rows``) holds the task's record itself (``extras["task"]``), so the
  training workers need no task files; ``init`` opens the episode and replaces the row's user
  message with the episode's prompt.
- ``step`` is one KernelAgent-v0 step with all the reply's calls; the observation is one user
  message (a reply whose text is no call is answered with a nudge, as ``kernel-env eval`` does).
  ``done`` is terminated or truncated; the step's reward is what the episode paid at it (the final
  reward on the last step, or milestones as reached with ``shaping="milestones"``).
- ``max_turns`` is SkyRL's generator's (``generator.max_turns``, which it puts in ``extras``).
- ``get_metrics`` gives turns, invalid calls, correctness and ``evaluator_fault`` (1 when the final
  evaluation failed by the evaluator's fault: the step then paid 0 and SkyRL cannot drop it).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

try:
    import skyrl_gym
    from omegaconf import DictConfig, OmegaConf
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.skyrl needs skyrl-gym ({exc}); "
                              "install it with: pip install 'kernel_env[skyrl]'", name=exc.name) from exc

from kernel_env.envs.agent import KernelAgentEnv
from kernel_env.evaluators.records import EvalSettings
from kernel_env.tasks import Task
from kernel_env.tools import tool_schemas
from kernel_env.workloads.runs.agent_eval import NUDGE, SYSTEM_PROMPT

#: The id this module registers with skyrl-gym.
ENV_ID = "kernel_agent"

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_prompt(tools: Iterable[str] | None = None) -> str:
    """``kernel-env eval``'s system prompt, with the tools' schemas and how to call them in text."""
    schemas = "\n".join(json.dumps(spec) for spec in tool_schemas(tools))
    return (f"{SYSTEM_PROMPT}\n\n# Tools\n\n<tools>\n{schemas}\n</tools>\n\n"
            "Call a tool by writing its name and arguments as one JSON object between <tool_call> and </tool_call>, "
            'for example:\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "model.py"}}\n</tool_call>')


def dataset_rows(tasks: Iterable[Task], *, tools: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """SkyRL's data set for ``tasks``: per task a prompt (``tool_prompt`` as the system message; the
    user message is replaced by the episode's prompt at ``init``), ``env_class`` and the task's record."""
    system = tool_prompt(tools)
    return [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": f"# Task {task.id}"}],
             "env_class": ENV_ID,
             "task": {key: value for key, value in dataclasses.asdict(task).items() if key != "metadata"}}
            for task in tasks]


def tool_calls(text: str) -> list[str]:
    """The JSON bodies of the ``<tool_call>`` blocks of a reply, after its reasoning (``</think>``)."""
    return [body.strip() for body in _TOOL_CALL.findall(text.rpartition("</think>")[2])]


class KernelAgentTextEnv(BaseTextEnv):
    """One KernelAgent-v0 episode as a skyrl-gym text environment (see the module docstring).

    ``env_config``: KernelAgentEnv's options (a dict or SkyRL's DictConfig; ``settings`` as a
    mapping); ``extras``: the data-set row (``task``) and SkyRL's ``max_turns``."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        options = OmegaConf.to_container(env_config, resolve=True) if isinstance(env_config, DictConfig) \
            else dict(env_config or {})
        extras = extras or {}
        if "max_turns" in extras:
            options["max_turns"] = int(extras["max_turns"])
        if "task" not in extras:
            raise ValueError("the data-set row has no 'task' (its task's record): make the rows with dataset_rows")
        if isinstance(options.get("settings"), Mapping):
            options["settings"] = EvalSettings(**options["settings"])
        self.env = KernelAgentEnv(Task(**extras["task"]), **options)
        self.max_turns = self.env.max_turns
        self.info: dict[str, Any] = {}

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Open the episode; the prompt's last (user) message becomes the episode's prompt."""
        observation, self.info = self.env.reset()
        return [*prompt[:-1], {"role": "user", "content": observation}], {"task_id": self.info["task_id"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Run the reply's tool calls (its text when it has none) as one KernelAgent-v0 step."""
        self.turns += 1
        calls = tool_calls(action)
        invalid_before = self.info.get("invalid_calls", 0)
        observation, reward, terminated, truncated, self.info = self.env.step(calls or action)
        done = terminated or truncated
        if not calls and self.info["invalid_calls"] > invalid_before:
            observation = f"{observation}\n\n{NUDGE}"
        metadata = {key: self.info[key] for key in ("turn", "invalid_calls", "final", "fault") if key in self.info}
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": observation}],
                                     reward=reward, done=done, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        final = self.info.get("final") or {}
        return {"turns": self.turns, "invalid_calls": self.info.get("invalid_calls", 0),
                "correct": float(bool(final.get("correct"))),
                "evaluator_fault": float(self.info.get("fault") == "evaluator")}

    def close(self) -> None:
        """End the episode (sandbox stopped, workspace deleted)."""
        self.env.close()


if ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:KernelAgentTextEnv")

__all__ = ["ENV_ID", "KernelAgentTextEnv", "dataset_rows", "tool_calls", "tool_prompt"]
