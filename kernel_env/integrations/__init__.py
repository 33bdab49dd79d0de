"""Plug-ins that put kernel_env's tasks, tools and trusted evaluation inside other agent frameworks.

Each plug-in is an optional extra with its own module, imported only when asked for:

- ``kernel_env.integrations.openhands`` (``pip install 'kernel_env[openhands]'``): an OpenHands
  agent works on a task in kernel_env's sandbox; see docs/openhands.md.
- ``kernel_env.integrations.openenv`` (``kernel_env[serve]``): ``kernel-env serve``, KernelAgent-v0
  and KernelRefine-v0 as an OpenEnv server for trainers that speak its protocol (verl, torchforge, ...);
  ``kernel_env.integrations.openenv_client``: its typed client (``KernelEnvClient``) and the action,
  observation and state types both sides use (openenv-core and pydantic only; no torch).
- ``kernel_env.integrations.verifiers`` (``kernel_env[verifiers]``): a verifiers environment
  (``load_environment``) for prime-rl and ``vf-eval``.
- ``kernel_env.integrations.skyrl`` (``kernel_env[skyrl]``): the skyrl-gym environment
  ``kernel_agent`` for SkyRL.

docs/trainers.md says how each trainer reaches them, and what each framework cannot carry.

A plug-in never changes what an episode is: the workspace, the sandbox, the broker and the final
trusted evaluation are ``kernel_env.runtime.episode.Episode``'s, so a plug-in's reward is KernelAgent-v0's.
"""
