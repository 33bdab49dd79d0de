"""kernel_env as an OpenEnv environment server (``kernel-env serve``): KernelAgent-v0 or
KernelRefine-v0 behind openenv-core's protocol, so that a trainer's OpenEnv client drives
episodes over the network while this process keeps the sandboxes and the evaluation pool.

::

    server = KernelEnvServer("agent", task="example/relu_add", language="cpp", device="cpu")
    server.run(listen("127.0.0.1", 8000), on_listening=print)   # until SIGTERM or SIGINT, then drains

    # the trainer's side, with openenv-core's own client
    async with GenericEnvClient(base_url="http://127.0.0.1:8000", message_timeout_s=900) as env:
        result = await env.reset(task="example/relu_add")
        result = await env.step({"tool_calls": [{"name": "Finish", "arguments": {}}]})
        result.reward, result.done, result.observation["info"]["final"]

The protocol is openenv-core's (``HTTPEnvServer``): a WebSocket session at ``/ws`` per client
(``reset``, ``step``, ``state``, ``close`` messages), each with an environment of its own; the
stateless HTTP ``/reset``, ``/step`` and ``/state`` (each request on a fresh environment, as
openenv-core defines them: an episode needs the WebSocket session), ``/schema`` and
``/metadata``. What runs behind a session is the environment itself (``KernelAgentEnv`` or
``KernelRefineEnv``), never a copy: the same tools and schemas, the same trusted final
evaluation, the same rewards. Every session's episodes submit to the one pool of this process,
as in-process episodes do (one pool per machine, not per session).

- ``ToolCallsAction`` / ``CompletionAction``: one step of each environment, carrying what its
  ``step`` takes.
- ``KernelObservation``: the environment's text, ``terminated`` / ``truncated`` and its ``info``
  whole (the tools' schemas at reset; ``final``, ``fault``, ``evaluations``, ``rollout``, ... as
  in-process), with OpenEnv's ``reward`` and ``done`` (terminated or truncated).
- ``KernelEnvironment``: openenv-core's ``Environment`` over one environment instance.
- ``Sessions``: what the server adds to openenv-core's sessions: idle timeouts, refusing new work
  while draining, and the count of resets and steps in flight.
- ``KernelEnvServer``: the app (openenv-core's routes, and a ``/health`` that says more), served by
  uvicorn until SIGTERM or SIGINT, then drained.

Limits. openenv-core refuses a session over ``max_sessions`` with its ``CAPACITY_REACHED`` error,
which the client reads as the answer to its first message (``_AnswerBeforeClosing``).
An episode whose session sent nothing for ``idle_timeout_s`` (no reset or step running) is
closed, its sandbox and workspace freed; the session's next step is refused with a message
saying so, and a reset starts a new episode. openenv-core's own idle reaper is not used: it
measures idleness from the end of the last answer, so it would close a session whose one step ran
longer than the timeout (a final evaluation waiting for a busy pool).

Drain (``run`` on SIGTERM or SIGINT): new resets and steps are refused (``/health`` answers 503
"draining"); steps in flight run on for up to ``drain_grace_s`` and are answered; then the pool is
closed (an evaluation still queued is answered as the evaluator's fault), uvicorn closes every
connection (WebSocket code 1012) and each session's episode is closed as its last step returns:
a command still running is not interrupted but ends at its own timeout. ``run`` returns once
every episode is closed.

The server trusts its clients: a reset may name any task the server can resolve (an example, a
KernelBench id, a task file on the server). Bind it to a private network.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

try:
    import uvicorn
    from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import Action, ConcurrencyConfig, Environment, HTTPEnvServer, Observation, State
    from openenv.core.env_server.types import EnvironmentMetadata
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.openenv needs openenv-core and its server ({exc}); "
                              "install them with: pip install 'kernel_env[serve]'", name=exc.name) from exc
from pydantic import Field

import kernel_env
from kernel_env.envs import make
from kernel_env.envs.common import EpisodeEnv
from kernel_env.runtime.episode import check_device
from kernel_env.runtime.pool import shared_pool

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- the types


class ToolCallsAction(Action):
    """A KernelAgent-v0 step: the tool calls of one model turn, run in order; or, with ``truncate``,
    the end of the episode for a budget the trainer keeps (``KernelAgentEnv.truncate``: the final
    evaluation runs and pays as at the turn limit)."""

    tool_calls: list[Any] = Field(default_factory=list,
                                  description="Each call as KernelAgent-v0's step takes it: {\"name\", \"arguments\"}, "
                                              "an OpenAI or Anthropic tool call, or its JSON string.")
    truncate: str | None = Field(default=None, description="End the episode now, for this reason (the trainer's "
                                                           "token or time budget ran out); tool_calls are not run.")

    def payload(self) -> list[Any]:
        return self.tool_calls


class CompletionAction(Action):
    """A KernelRefine-v0 step: one model completion, with its code in the language's tag or a fenced block."""

    content: str = Field(description="The completion's text.")
    reasoning_content: str | None = Field(default=None,
                                          description="The model's reasoning, where the server split it off.")

    def payload(self) -> dict[str, str]:
        return self.model_dump(include={"content", "reasoning_content"}, exclude_none=True)


class KernelObservation(Observation):
    """What a reset or step answers (``reward`` and ``done`` are OpenEnv's: ``done`` is terminated or truncated)."""

    text: str = Field(default="", description="The environment's text: the prompt, the tools' output, the feedback.")
    terminated: bool = Field(default=False, description="The episode ended by the agent (Finish, or a fast solution).")
    truncated: bool = Field(default=False, description="The episode was cut short (the turn limit, an evaluator's "
                                                       "fault: info['fault'] == 'evaluator', drop it from training).")
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's info, whole: the tools' schemas "
                                                                   "at reset; final, fault, evaluations, rollout, ...")


class KernelState(State):
    """A session's environment: its task, where it runs, and whether an episode is open."""

    env: str = Field(description="KernelAgent-v0 or KernelRefine-v0.")
    task_id: str | None = Field(default=None, description="The task of the current (or next) episode.")
    language: str
    device: str
    max_turns: int
    episode_open: bool = Field(default=False, description="An episode holds a sandbox and a workspace.")
    done: bool = Field(default=False, description="The episode has ended.")


#: The environments the server runs, by ``--env``: the name and the action of a step.
ENVIRONMENTS: dict[str, tuple[str, type[Action]]] = {
    "agent": ("KernelAgent-v0", ToolCallsAction),
    "refine": ("KernelRefine-v0", CompletionAction),
}


class Refused(RuntimeError):
    """The server will not run this reset or step (draining, an idle episode closed); the message says why."""


# ---------------------------------------------------------------------------------- sessions


class KernelEnvironment(Environment):
    """openenv-core's Environment over one KernelAgent-v0 / KernelRefine-v0 instance.

    openenv-core makes one per session (and one per stateless HTTP request) and calls ``reset``
    and ``step`` on a thread of the session's own; the idle reaper and the drain reach it from
    other threads, so a reset, a step and closing the episode each hold ``_lock``."""

    # Each instance has its own episode (workspace, sandbox, broker); they share only the pool.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, name: str, sessions: Sessions, options: dict[str, Any]):
        super().__init__()
        self.name = name
        self.env: EpisodeEnv = make(name, **options)
        self.sessions = sessions
        self.episode_id: str | None = None
        self.last_active = time.monotonic()
        #: Set when the reaper closed the episode: the idle timeout it passed.
        self.expired_after: float | None = None
        self._lock = threading.Lock()
        sessions.add(self)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
              **options: Any) -> KernelObservation:
        """Close the session's episode, if any, and open one; ``task`` names its task (a spec the
        server resolves; default: the server's task)."""
        if options:
            raise ValueError(f"unknown reset option(s): {', '.join(sorted(options))} (known: seed, episode_id, task)")
        if task is None and self.env.task is None:
            raise ValueError("no task: name one in reset (task=\"example/relu_add\"), or start the server with --task")
        with self._turn():
            self.expired_after = None
            text, info = self.env.reset(seed=seed, options={"task": task} if task is not None else None)
            self.episode_id = episode_id or uuid.uuid4().hex
        return KernelObservation(text=text, info=info)

    def step(self, action: Action, timeout_s: float | None = None, **_: Any) -> KernelObservation:
        """One step of the episode. ``timeout_s`` (an HTTP request's) is not used: every tool call
        has its own timeout."""
        with self._turn():
            if self.expired_after is not None:
                raise Refused(f"this session's episode was closed after {self.expired_after:g} s without a message "
                              "(the server's idle timeout); reset to start a new one")
            reason = getattr(action, "truncate", None)
            text, reward, terminated, truncated, info = \
                self.env.truncate(reason) if reason else self.env.step(action.payload())
        return KernelObservation(text=text, terminated=terminated, truncated=truncated, info=info,
                                 done=terminated or truncated, reward=reward)

    @property
    def state(self) -> KernelState:
        env = self.env
        return KernelState(episode_id=self.episode_id, step_count=env.turn, env=self.name,
                           task_id=env.task.id if env.task is not None else None, language=env.language,
                           device=env.device, max_turns=env.max_turns, episode_open=env.episode is not None,
                           done=env.done)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.name, version=kernel_env.__version__,
                                   description=f"kernel_env's {self.name}: GPU kernel engineering tasks in a sandboxed "
                                               "workspace, rewarded by a trusted evaluation")

    def close(self) -> None:
        """Close the episode (sandbox, broker, workspace), after a step in flight has returned."""
        with self._lock:
            self.env.close()
        self.sessions.discard(self)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """A reset or step: admitted (``Sessions.working``), under the lock, and the session's last
        activity when it ends (set before the lock is let go, so the reaper never sees it stale)."""
        with self.sessions.working(), self._lock:
            try:
                yield
            finally:
                self.last_active = time.monotonic()

    def close_if_idle(self, timeout_s: float) -> bool:
        """Close the episode if nothing ran in it for ``timeout_s`` seconds; never under a reset or step."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.env.episode is None or time.monotonic() - self.last_active < timeout_s:
                return False
            self.env.close()
            self.expired_after = timeout_s
            return True
        finally:
            self._lock.release()


@dataclass(frozen=True)
class DrainReport:
    """How a drain went: the episodes open when it began (all closed by its end), the steps still
    running when its grace ended, and how long it took."""

    episodes: int
    steps_cut: int
    seconds: float


class Sessions:
    """The server's environments (one per OpenEnv session, and the short-lived ones of stateless
    HTTP requests): the work in flight, idle timeouts and the drain.

    ``idle_timeout_s``: an episode with no reset or step for this long is closed (None: never)."""

    def __init__(self, idle_timeout_s: float | None):
        self.idle_timeout_s = idle_timeout_s
        self.draining = False
        self._members: set[KernelEnvironment] = set()
        self._in_flight = 0
        self._cv = threading.Condition()
        self._stopped = threading.Event()
        if idle_timeout_s is not None:
            threading.Thread(target=self._reap, name="kernel_env-serve-reaper", daemon=True).start()

    def add(self, env: KernelEnvironment) -> None:
        with self._cv:
            self._members.add(env)

    def discard(self, env: KernelEnvironment) -> None:
        with self._cv:
            self._members.discard(env)

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """A reset or step: refused while draining, counted in flight until it returns."""
        with self._cv:
            if self.draining:
                raise Refused("the server is shutting down: it starts no new episode or step; "
                              "connect to another server")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"episodes": sum(env.env.episode is not None for env in self._members),
                    "in_flight": self._in_flight, "draining": self.draining}

    def drain(self, grace_s: float) -> tuple[int, int]:
        """Refuse new resets and steps, and wait up to ``grace_s`` seconds for those in flight.
        Returns (episodes open, steps still running when the grace ended)."""
        self._stopped.set()
        deadline = time.monotonic() + grace_s
        with self._cv:
            self.draining = True
            episodes = sum(env.env.episode is not None for env in self._members)
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            return episodes, self._in_flight

    def close_all(self) -> None:
        """Close every environment still here (each after its step in flight, if any)."""
        with self._cv:
            members = list(self._members)
        for env in members:
            env.close()

    def _reap(self) -> None:
        timeout = self.idle_timeout_s
        while not self._stopped.wait(min(max(timeout / 4, 0.5), 30.0)):
            with self._cv:
                members = list(self._members)
            for env in members:
                if env.close_if_idle(timeout):
                    log.info("closed the episode %s of %s: no message for %g s", env.episode_id, env.name, timeout)


# ---------------------------------------------------------------------------------- the server


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one) for ``KernelEnvServer.run``. Raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its signal handlers: ``KernelEnvServer.run`` decides when it stops
    (uvicorn's own would close every connection at once, and raise the signal again on exit)."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


async def _client_gone(websocket: WebSocket, exc: WebSocketDisconnect) -> None:
    """A WebSocket whose client has gone: nothing to answer, and nothing to log."""


class _AnswerBeforeClosing:
    """ASGI middleware: a WebSocket that the app closes before the client's first message (openenv-core
    refuses a session over the limit by sending the error and closing at once) is closed only once
    that message has come (10 s at most). Otherwise a client that sends its reset after the close
    finds the connection gone and never reads why; this way the error is the answer to its reset."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        heard = False

        async def listened():
            nonlocal heard
            message = await receive()
            heard = heard or message["type"] != "websocket.connect"
            return message

        async def closing_late(message) -> None:
            if message["type"] == "websocket.close" and not heard:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(receive(), timeout=10)
            await send(message)

        await self.app(scope, listened, closing_late)


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    """An HTTP request the server will not run: 503 and why (FastAPI would answer a bare 500)."""
    return JSONResponse({"detail": str(exc)}, status_code=503)


class KernelEnvServer:
    """KernelAgent-v0 (``env="agent"``) or KernelRefine-v0 (``"refine"``) as an OpenEnv server.

    ``max_sessions``: WebSocket sessions at once (openenv-core refuses one more);
    ``idle_timeout_s``: an episode with no reset or step for this long is closed (None: never);
    ``drain_grace_s``: how long a drain lets steps in flight run on; ``pool``: the kind of this
    process's shared pool ("local", "ray"), every session's; ``env_options``: the environment's
    keyword arguments (task, language, device, sandbox, max_turns, settings, ...), checked here:
    raises what the environment raises for a bad one (ValueError, TaskError), EpisodeError for a
    language the device cannot run."""

    def __init__(self, env: str = "agent", *, max_sessions: int = 64, idle_timeout_s: float | None = 1800.0,
                 drain_grace_s: float = 60.0, pool: str = "local", **env_options: Any):
        if env not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {env!r}; available: {', '.join(ENVIRONMENTS)}")
        self.name, action = ENVIRONMENTS[env]
        probe = make(self.name, **env_options)  # the options' errors here, not in every session
        check_device(probe.lang, probe.device)
        self.language, self.device = probe.language, probe.device
        self.drain_grace_s = drain_grace_s
        self.pool = shared_pool(pool)
        self.sessions = Sessions(idle_timeout_s)
        options = dict(env_options, task=probe.task, language=self.language, device=self.device, pool=self.pool)
        self._openenv = HTTPEnvServer(functools.partial(KernelEnvironment, self.name, self.sessions, options), action,
                                      KernelObservation,
                                      concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions))
        self.app = FastAPI(title=f"kernel_env {self.name}", version=kernel_env.__version__)
        # Before openenv-core's routes: this /health is the one that answers (openenv-core's says only "healthy").
        self.app.get("/health", summary="Health, sessions and the drain (503 while draining)")(self.health)
        self._openenv.register_routes(self.app)
        # openenv-core's /ws handler closes the socket once more after the client has closed it, which
        # raises WebSocketDisconnect: uvicorn would log a traceback for every session that ends normally.
        self.app.add_exception_handler(WebSocketDisconnect, _client_gone)
        self.app.add_exception_handler(Refused, _refused)  # over HTTP; a WebSocket session gets openenv-core's error
        self.app.add_middleware(_AnswerBeforeClosing)

    def health(self) -> JSONResponse:
        status = self.sessions.status()
        body = {"status": "draining" if status["draining"] else "healthy", "env": self.name, "language": self.language,
                "device": self.device, "sessions": self._openenv.active_sessions,
                "max_sessions": self._openenv.max_concurrent_envs, "episodes": status["episodes"],
                "in_flight": status["in_flight"], "idle_timeout_s": self.sessions.idle_timeout_s}
        return JSONResponse(body, status_code=503 if status["draining"] else 200)

    def run(self, sock: socket.socket, *, on_listening: Callable[[str], None] = lambda url: None) -> DrainReport:
        """Serve on ``sock`` (``listen``) until SIGTERM or SIGINT, then drain (the module docstring
        says how); ``on_listening`` gets the address once connections are accepted."""
        return asyncio.run(self._serve(sock, on_listening))

    async def _serve(self, sock: socket.socket, on_listening: Callable[[str], None]) -> DrainReport:
        server = _Uvicorn(uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=None))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if not server.started:
            await serving
            raise RuntimeError("the HTTP server did not start (its log above says why)")
        host, port = sock.getsockname()[:2]
        on_listening(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        await asyncio.wait([serving, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        started = time.monotonic()
        episodes, cut = await asyncio.to_thread(self.sessions.drain, self.drain_grace_s)
        if cut:
            log.warning("%d step(s) still running after the %g s grace: their episodes close as they return",
                        cut, self.drain_grace_s)
        self.pool.close()  # what still waits for an evaluation is answered now
        server.should_exit = True  # uvicorn closes every connection; openenv-core closes each session's environment
        await serving
        await asyncio.to_thread(self.sessions.close_all)
        return DrainReport(episodes=episodes, steps_cut=cut, seconds=time.monotonic() - started)
