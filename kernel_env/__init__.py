"""kernel_env: reinforcement-learning environments for GPU kernel engineering.

The public API: the environments (``make``; ``gymnasium.make("kernel_env/KernelAgent-v0")``),
tasks (``Task``, ``load_tasks``, ``resolve_task``, ``validate_task``), workspaces and episodes
(``Workspace``, ``Episode``, ``run_solution``), and the trusted evaluation's records
(``EvalResult``, ``Mode``) and reward (``paid_reward``: what a result pays; ``milestone_reward``,
``speedup_reward``). Names are imported on first use,
so ``import kernel_env`` does not import torch; it registers the environments with gymnasium.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "make": "kernel_env.envs",
    "Episode": "kernel_env.runtime.episode", "run_solution": "kernel_env.runtime.episode",
    "EvalJob": "kernel_env.evaluators.records", "EvalResult": "kernel_env.evaluators.records",
    "EvalSettings": "kernel_env.evaluators.records", "Mode": "kernel_env.evaluators.records",
    "milestone_reward": "kernel_env.evaluators.reward", "speedup_reward": "kernel_env.evaluators.reward",
    "paid_reward": "kernel_env.evaluators.reward",
    "Task": "kernel_env.tasks", "TaskError": "kernel_env.tasks", "load_tasks": "kernel_env.tasks",
    "resolve_task": "kernel_env.tasks", "validate_task": "kernel_env.tasks",
    "Workspace": "kernel_env.workspace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernel_env' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


importlib.import_module("kernel_env.envs").register()
