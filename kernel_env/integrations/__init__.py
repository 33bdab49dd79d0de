"""Plug-ins that put kernel_env's tasks, tools and trusted evaluation inside other agent frameworks.

Each plug-in is an optional extra with its own module, imported only when asked for:

- ``kernel_env.integrations.openhands`` (``pip install 'kernel_env[openhands]'``): an OpenHands
  agent works on a task in kernel_env's sandbox; see docs/openhands.md.

A plug-in never changes what an episode is: the workspace, the sandbox, the broker and the final
trusted evaluation are ``kernel_env.runtime.episode.Episode``'s, so a plug-in's reward is KernelAgent-v0's.
"""
