"""What both environments share: ``EpisodeEnv``, the life of one runtime ``Episode`` behind the
Gymnasium API (open on ``reset``, close on the next ``reset`` or ``close``, the async
``areset``/``astep``); the text spaces of prompts, tool output and model completions; and the
threads that run a blocking ``reset``/``step`` for the async API.

What an action means, what an observation says and what a step pays belong to each environment
(``agent.py``, ``refine.py``); nothing here interprets an action or pays a reward.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import gymnasium
from gymnasium import spaces

from kernel_env.evaluators.records import EvalSettings
from kernel_env.languages import Language, get_language
from kernel_env.runtime.episode import Episode, language_and_device
from kernel_env.runtime.pool import GpuPool, shared_pool
from kernel_env.tasks import Task, resolve_task

T = TypeVar("T")

#: The observation of a ``step`` after the episode ended.
ENDED = "The episode has ended; call reset() to start a new one."

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


class EpisodeEnv(gymnasium.Env[str, Any], abc.ABC):
    """An environment whose episode is one ``Episode``: a fresh workspace holding the task, a
    sandbox over it, and a broker that sends its evaluations to the pool. A subclass sets
    ``observation_space`` and ``action_space``, implements ``step`` and ``_start``, extends
    ``_reset_state`` / ``_close_episode`` for what it keeps per episode, and sets its defaults.

    Args:
        task: a Task, or a spec for ``resolve_task``; None until ``reset(options={"task": ...})``
            names one (which also switches task).
        language: cuda | cpp | triton; None: cuda where a GPU is visible, else cpp.
        device: where the trusted harness runs, cuda | cpu; None: cuda where a GPU is visible.
        sandbox: the sandbox backend, "local" (bubblewrap) or "docker".
        sandbox_options: the backend's constructor's keyword arguments (docker: ``{"image": ...}``).
        pool: a GpuPool, or a pool kind ("local", "ray") for this process's shared pool of that
            kind; None: the shared local pool.
        max_turns: steps before the episode is truncated (at least 1).
        settings: EvalSettings for every evaluation of the episode; None: the protocol's.
        kernelbench_root: the KernelBench checkout of ``kernelbench/...`` specs; None:
            ``$KERNEL_ENV_KERNELBENCH``.

    Raises:
        ValueError: max_turns below 1, an unknown language or pool kind.
        TaskError: a task spec that names no task.
    """

    metadata = {"render_modes": []}

    def __init__(self, task: Task | str | None, *, language: str | None, device: str | None, sandbox: str,
                 sandbox_options: dict[str, Any] | None, pool: GpuPool | str | None, max_turns: int,
                 settings: EvalSettings | None, kernelbench_root: str | None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        language, self.device = language_and_device(language, device)  # the machine's unless named
        self.lang: Language = get_language(language)
        self.kernelbench_root = kernelbench_root
        self.task = self._task(task) if task is not None else None
        self.sandbox_kind, self.sandbox_options = sandbox, sandbox_options
        self.pool = shared_pool(pool) if isinstance(pool, str) else pool
        self.max_turns = max_turns
        self.settings = settings or EvalSettings()
        self.episode: Episode | None = None
        self._reset_state()

    @property
    def language(self) -> str:
        return self.lang.name

    # ------------------------------------------------------------------ the contract

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Close the previous episode and open a fresh one on the task: a new workspace, sandbox
        and broker.

        Args:
            seed: seeds the environment's ``np_random``, as gymnasium does; nothing of the
                episode draws from it.
            options: ``{"task": Task or spec}`` switches task first; other keys are ignored.

        Returns:
            observation (str): the task's prompt (each environment says what it holds).
            info (dict): ``task_id``, ``language``, ``device``, ``max_turns``, ``turn`` (0),
                ``workspace_host_path``, and each environment's own keys.

        Raises:
            ValueError: there is no task (none given here nor at construction).
            TaskError: ``options["task"]`` names no task; the open episode stays open.
            EpisodeError: a language or device that cannot run here; no episode is left open.
            SandboxError: the sandbox cannot be made or started here; no episode is left open."""
        super().reset(seed=seed)
        if options and options.get("task") is not None:
            self.task = self._task(options["task"])
        if self.task is None:
            raise ValueError(f"no task: pass task=... to {type(self).__name__} or reset(options={{'task': ...}})")
        self._close_episode()
        self._reset_state()
        self.episode = Episode.open(self.task, language=self.language, device=self.device, sandbox=self.sandbox_kind,
                                    pool=self.pool, settings=self.settings, sandbox_options=self.sandbox_options)
        return self._start()

    @abc.abstractmethod
    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Answer one action. Never raises for anything a model sends: a malformed action is
        answered as text and counts as a turn.

        Args:
            action: what the model produced, in the form ``action_space`` contains.

        Returns:
            observation (str): the environment's answer to the action.
            reward (float): what this step pays (a result that failed by the evaluator's fault pays
                0, never -1).
            terminated (bool): the episode reached its own end.
            truncated (bool): the episode was cut short (``max_turns``, or a final evaluation that
                failed by the evaluator's fault); either way, call ``reset`` next.
            info (dict): ``turn``, ``max_turns``, and each environment's own keys.
            After the episode ended: ``ENDED`` with reward 0."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """``reset`` on a step thread, so that one event loop drives many episodes."""
        return await in_thread(functools.partial(self.reset, seed=seed, options=options))

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``step`` on a step thread, so that one event loop drives many episodes."""
        return await in_thread(functools.partial(self.step, action))

    def close(self) -> None:
        """Close the episode (its sandbox, broker and workspace); the environment can be reset again."""
        self._close_episode()

    # ------------------------------------------------------------------ for subclasses

    @abc.abstractmethod
    def _start(self) -> tuple[str, dict[str, Any]]:
        """The first observation and info of the episode ``reset`` just opened (``self.episode``)."""

    def _reset_state(self) -> None:
        """Forget the previous episode's turns; a subclass extends this with what it counts."""
        self.turn = 0
        self.done = False

    def _close_episode(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None

    def _task(self, task: Task | str) -> Task:
        return task if isinstance(task, Task) else resolve_task(task, kernelbench_root=self.kernelbench_root)
