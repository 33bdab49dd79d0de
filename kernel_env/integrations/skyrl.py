"""kernel_env as a skyrl-gym environment, the shape SkyRL trains on: ``kernel_agent`` is one
KernelAgent-v0 episode behind skyrl-gym's text-in / text-out ``BaseTextEnv``, rewarded by the
trusted final evaluation. Importing this module registers it with skyrl-gym, per process: SkyRL
must import it where its generator makes the environments. docs/trainers.md ("SkyRL") shows its
use, how it maps and what SkyRL's generator cannot carry.

- ``dataset_rows``: SkyRL's data set, a row per task holding its record; ``ENV_ID``: ``kernel_agent``.
- ``KernelAgentTextEnv``: the environment; ``step`` is one KernelAgent-v0 step with all the
  reply's calls, paid what the episode paid at it.
- ``tool_prompt``: the system message that lists the tools; ``tool_calls``: the calls of a reply.

Why KernelAgent-v0 and not KernelRefine-v0 (whose text shape fits with no parsing): the refine
loop makes SFT data; agents are trained with tools in a sandbox. SkyRL renders the prompt without
``tools=`` and hands ``step`` the decoded reply, so the system message describes the tools and the
calls are the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after the
reasoning (the Hermes format Qwen2.5 / Qwen3 chat templates render and vLLM's ``hermes`` parser reads).
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
    """SkyRL's data set for ``tasks`` (save it as Parquet: examples/train/skyrl/prepare_data.py).

    Args:
        tasks: the tasks, e.g. ``kernel_env.load_tasks("~/KernelBench")``.
        tools: the tool names the system message lists (default: all); give the environments the
            same ``tools`` option.

    Returns:
        One row per task: ``prompt`` (``tool_prompt`` as the system message, and a user message
        that ``init`` replaces with the episode's prompt), ``env_class`` (``ENV_ID``) and
        ``task``, the task's record (so the training workers need no task files)."""
    system = tool_prompt(tools)
    return [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": f"# Task {task.id}"}],
             "env_class": ENV_ID,
             "task": {key: value for key, value in dataclasses.asdict(task).items() if key != "metadata"}}
            for task in tasks]


def tool_calls(text: str) -> list[str]:
    """The JSON bodies of the ``<tool_call>`` blocks of a reply, after its reasoning (``</think>``)."""
    return [body.strip() for body in _TOOL_CALL.findall(text.rpartition("</think>")[2])]


class KernelAgentTextEnv(BaseTextEnv):
    """One KernelAgent-v0 episode as a skyrl-gym text environment::

        rows = dataset_rows(kernel_env.load_tasks("examples"))
        env = skyrl_gym.make("kernel_agent", env_config={"language": "cpp", "device": "cpu"}, extras=rows[0])
        prompt, _ = env.init(rows[0]["prompt"])
        out = env.step('<tool_call>{"name": "Read", "arguments": {"file_path": "model.py"}}</tool_call>')

    Args:
        env_config: KernelAgentEnv's options (a dict or SkyRL's DictConfig, from
            ``environment.skyrl_gym.kernel_agent``; ``settings`` as a mapping).
        extras: the data-set row (its ``task``) and the ``max_turns`` SkyRL's generator puts there
            (``generator.max_turns``), which becomes the episode's.

    Raises:
        ValueError: the row has no ``task``; and what ``KernelAgentEnv`` raises for a bad option."""

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
