"""What both environments share: a text space for prompts and tool output, and the threads that
run a blocking ``reset``/``step`` for the async API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gymnasium import spaces

T = TypeVar("T")

#: Threads for ``areset``/``astep``: each in-flight step holds one while it waits for its sandbox or
#: the pool (asyncio's default executor has a handful, which would serialise hundreds of episodes).
_EXECUTOR = ThreadPoolExecutor(max_workers=512, thread_name_prefix="kernel_env-step")


class TextSpace(spaces.Text):
    """Any text up to ``max_length`` characters (gymnasium's Text limits the alphabet; tool output
    and prompts cannot be)."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class ModelOutputSpace(spaces.Space[Any]):
    """Actions as a model produces them (text, tool calls, message objects): no shape, no dtype,
    not flattenable to arrays. Subclasses say what they contain and what ``sample()`` gives."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False


async def in_thread(call: Callable[[], T]) -> T:
    """Run a blocking call on the shared step threads."""
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, call)
