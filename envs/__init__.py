"""kernel_env.envs: the Gymnasium environments.

- ``KernelAgent-v0`` (``agent.py``): one tool call (or a list of them) per step in a sandboxed
  workspace; the episode ends with ``Finish`` or the turn limit and a trusted final evaluation.
- ``KernelRefine-v0`` (``refine.py``): the fixed multi-turn refine loop; one model completion
  with code per step, answered with feedback. What it says and when it stops is the refine
  protocol (``refine_protocol.py``: pure, shared with ``kernel_env.workloads.runs.generate``).

Both build on ``EpisodeEnv`` (``common.py``): one runtime episode per ``reset``, the async
``areset`` / ``astep``, the text spaces. Both are registered with gymnasium as
``kernel_env/<name>`` when ``kernel_env`` is imported; ``kernel_env.make(name, ...)`` builds one
without gymnasium's wrappers (so ``areset`` and ``astep`` are at hand).
"""

from __future__ import annotations

import gymnasium

ENTRY_POINTS = {
    "KernelAgent-v0": "kernel_env.envs.agent:KernelAgentEnv",
    "KernelRefine-v0": "kernel_env.envs.refine:KernelRefineEnv",
}


def register() -> None:
    """Register every environment as ``kernel_env/<name>`` (idempotent)."""
    for name, entry_point in ENTRY_POINTS.items():
        if f"kernel_env/{name}" not in gymnasium.registry:
            gymnasium.register(id=f"kernel_env/{name}", entry_point=entry_point, disable_env_checker=False)


def make(env_id: str, **kwargs) -> gymnasium.Env:
    """Build an environment by name, without gymnasium's wrappers (so ``areset`` / ``astep`` are
    at hand).

    Args:
        env_id: ``KernelAgent-v0`` or ``KernelRefine-v0``, with or without the ``kernel_env/``
            prefix.
        **kwargs: the environment's keyword arguments: ``kernel_env.envs.agent.KernelAgentEnv``'s or
            ``kernel_env.envs.refine.KernelRefineEnv``'s (``help()`` on either lists them).

    Returns:
        The environment, not yet reset.

    Raises:
        ValueError: an unknown name, or what the environment's constructor raises."""
    name = env_id.removeprefix("kernel_env/")
    if name not in ENTRY_POINTS:
        raise ValueError(f"unknown environment {env_id!r}; available: {', '.join(ENTRY_POINTS)}")
    module, _, cls = ENTRY_POINTS[name].partition(":")
    import importlib

    return getattr(importlib.import_module(module), cls)(**kwargs)


register()
