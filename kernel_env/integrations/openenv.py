"""``kernel-env serve``: KernelAgent-v0 or KernelRefine-v0 behind openenv-core's protocol, so that a
trainer's OpenEnv client drives episodes over the network while this process keeps the sandboxes
and the evaluation pool. docs/trainers.md ("kernel-env serve") is the reference: the protocol, the
error codes, the limits, the drain. The wire types are ``openenv_client``'s, shared with the client.

- ``KernelEnvServer``: the app (openenv-core's routes, a ``/health`` that says more); ``run`` serves
  it on a socket from ``listen`` until SIGTERM or SIGINT, then drains (a ``DrainReport``).
- ``KernelEnvironment``: openenv-core's ``Environment`` over one environment instance, per session.
- ``Sessions``: idle timeouts, refusals while draining (``Refused``), the resets and steps in flight.
- ``app``: a server with the defaults, for ``uvicorn kernel_env.integrations.openenv:app``
  (openenv.yaml's ``app``), without the drain.

Behind a session runs the environment itself, never a copy, and every session submits to the one
pool of this process. The server trusts its clients (a reset may name any task file on the
server): bind it to a private network.

Why one module of this length: the environments, the sessions, the WebSocket middleware and the
drain act on one another's state (an environment's lock and refusal, the drain's flag, a
connection's environment); split, each part would reach into the others' internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
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
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import Action, ConcurrencyConfig, Environment, HTTPEnvServer
    from openenv.core.env_server.types import EnvironmentMetadata

    from kernel_env.integrations.openenv_client import (
        ErrorCode,
        KernelAgentAction,
        KernelEnvObservation,
        KernelEnvState,
        KernelRefineAction,
    )
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.openenv needs openenv-core and its server ({exc}); "
                              "install them with: pip install -e '.[serve]' (in the checkout)", name=exc.name) from exc

import kernel_env
from kernel_env.config import DEFAULT_POOL
from kernel_env.envs import make
from kernel_env.envs.common import EpisodeEnv
from kernel_env.runtime.episode import check_device
from kernel_env.runtime.pool import GpuPool, LocalPool, shared_pool

log = logging.getLogger(__name__)


#: The environments the server runs, by ``--env``: the name and the action of a step.
ENVIRONMENTS: dict[str, tuple[str, type[Action]]] = {
    "agent": ("KernelAgent-v0", KernelAgentAction),
    "refine": ("KernelRefine-v0", KernelRefineAction),
}


class Refused(RuntimeError):
    """The server will not run this reset or step: ``code`` (an ``ErrorCode``) says why, the message
    what to do."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code.value


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
        #: The last reset's or step's refusal, until its answer is sent with the refusal's code (``take_refusal``).
        self.refusal: Refused | None = None
        self._lock = threading.Lock()
        sessions.add(self)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
              **options: Any) -> KernelEnvObservation:
        """Close the session's episode, if any, and open one (a reset message's ``data``).

        Args:
            seed: the environment's reset seed.
            episode_id: the id ``state`` reports (default: a fresh one).
            task: a task spec the server resolves (default: the server's ``--task``).

        Returns:
            The prompt as ``text``, the environment's reset info (the tools' schemas, ...) as ``info``.

        Raises:
            ValueError: an unknown option, or no task here nor on the server.
            Refused: the server is draining.
            And what the environment's ``reset`` raises (TaskError, EpisodeError, SandboxError)."""
        if options:
            raise ValueError(f"unknown reset option(s): {', '.join(sorted(options))} (known: seed, episode_id, task)")
        if task is None and self.env.task is None:
            raise ValueError("no task: name one in reset (task=\"example/relu_add\"), or start the server with --task")
        with self._turn():
            self.expired_after = None
            text, info = self.env.reset(seed=seed, options={"task": task} if task is not None else None)
            self.episode_id = episode_id or uuid.uuid4().hex
        return KernelEnvObservation(text=text, info=info)

    def step(self, action: Action, timeout_s: float | None = None, **_: Any) -> KernelEnvObservation:
        """One step of the episode, or its end for the trainer's budget (``truncate``).

        Args:
            action: a ``KernelAgentAction`` or ``KernelRefineAction``, as ``ENVIRONMENTS`` names.
            timeout_s: an HTTP request's; not used: every tool call has its own timeout.

        Returns:
            The step's text, ``terminated`` / ``truncated``, the whole ``info``, and OpenEnv's
            ``reward`` and ``done`` (terminated or truncated).

        Raises:
            Refused: the idle timeout closed the episode (SESSION_IDLE_TIMEOUT), or the server is
                draining (SERVER_DRAINING)."""
        with self._turn():
            if self.expired_after is not None:
                raise Refused(ErrorCode.SESSION_IDLE_TIMEOUT,
                              f"this session's episode was closed after {self.expired_after:g} s without a message "
                              "(the server's idle timeout); reset to start a new one")
            reason = getattr(action, "truncate", None)
            text, reward, terminated, truncated, info = \
                self.env.truncate(reason) if reason else self.env.step(action.payload())
        return KernelEnvObservation(text=text, terminated=terminated, truncated=truncated, info=info,
                                    done=terminated or truncated, reward=reward)

    @property
    def state(self) -> KernelEnvState:
        env = self.env
        return KernelEnvState(episode_id=self.episode_id, step_count=env.turn, env=self.name,
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

    def take_refusal(self) -> Refused | None:
        """The refusal the answer now being sent carries, if any (``_Connection.coded``); forgotten here."""
        refusal, self.refusal = self.refusal, None
        return refusal

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """A reset or step: admitted (``Sessions.working``), under the lock, and the session's last
        activity when it ends (set before the lock is let go, so the reaper never sees it stale).
        A refusal is kept for its answer's code (openenv-core answers it as EXECUTION_ERROR)."""
        try:
            with self.sessions.working(), self._lock:
                try:
                    yield
                finally:
                    self.last_active = time.monotonic()
        except Refused as refusal:
            self.refusal = refusal
            raise

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

    ``idle_timeout_s``: an episode with no reset or step for this long is closed (None: never).
    Idleness is counted from the end of the last reset or step and never during one, which is why
    openenv-core's own reaper is not used: it counts from the end of the last answer, so it would
    close a session whose one step outlasted the timeout (a final evaluation waiting for a busy pool)."""

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
                raise Refused(ErrorCode.SERVER_DRAINING, "the server is shutting down: it starts no new episode or "
                                                         "step; connect to another server")
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
    """A socket to serve on, for ``KernelEnvServer.run``.

    Args:
        host: the address to bind (a name or an IPv4 / IPv6 address).
        port: the port; 0 takes a free one (``getsockname`` says which).

    Returns:
        A bound stream socket (SO_REUSEADDR), not yet listening.

    Raises:
        OSError: the address cannot be resolved or bound."""
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


#: Close codes of a WebSocket session that ended as it should: closed by its client (1000; 1001, going
#: away) or by uvicorn's shutdown at the end of a drain (1012). Any other (1005, 1006: the connection
#: was lost) is a client gone without closing its session.
_CLOSED_CLEANLY = frozenset({1000, 1001, 1012})


class _Connection:
    """One WebSocket connection, as ``_WebSocketSessions`` sees it: the client's address, its
    session's environment (once openenv-core has made it: ``_OpenEnvServer``), and whether a message
    other than the handshake has come and whether the client is gone."""

    def __init__(self, scope: dict[str, Any]):
        host, port = scope.get("client") or ("unknown", 0)
        self.client = f"{host}:{port}"
        self.env: KernelEnvironment | None = None
        self.heard = False
        self.gone = False

    def __str__(self) -> str:
        env = self.env
        if env is None or env.env.episode is None:
            return f"the session of {self.client} (no episode open)"
        return f"the session of {self.client} (episode {env.episode_id} of {env.env.task.id}, turn {env.env.turn})"

    def coded(self, message: dict[str, Any]) -> dict[str, Any]:
        """The WebSocket message with its refusal's code where openenv-core wrote EXECUTION_ERROR."""
        refusal = self.env.take_refusal() if self.env is not None else None
        if refusal is None or message.get("text") is None:
            return message
        answer = json.loads(message["text"])
        if answer.get("type") != "error" or answer.get("data", {}).get("message") != str(refusal):
            return message
        answer["data"]["code"] = refusal.code
        return {**message, "text": json.dumps(answer)}


#: The WebSocket connection this task serves (set by ``_WebSocketSessions``, read by ``_OpenEnvServer``).
_connection: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar("kernel_env_connection", default=None)


class _OpenEnvServer(HTTPEnvServer):
    """openenv-core's server, which tells each WebSocket connection its session's environment.
    ``_create_session`` is openenv-core's own (0.3.0), awaited by its /ws handler in the
    connection's task; the environment itself is made on another thread, which cannot see it."""

    async def _create_session(self) -> tuple[str, Environment]:
        session_id, env = await super()._create_session()
        if (connection := _connection.get()) is not None:
            connection.env = env
        return session_id, env


class _WebSocketSessions:
    """ASGI middleware over openenv-core's WebSocket sessions (its /ws handler stays as it is):

    - a refusal (``Refused``) is answered with its own code (``_Connection.coded``);
    - a client gone without closing its session is one warning naming the session; after that,
      nothing is sent (an answer is dropped) and the handler's next receive is the disconnect, so
      the session ends as one whose client left and its episode is closed;
    - a WebSocket that the app closes before the client's first message (openenv-core refuses a
      session over the limit by sending the error and closing at once) is closed only once that
      message has come (10 s at most): otherwise a client that sends its reset after the close
      finds the connection gone and never reads why; this way the error is the answer to its reset.

    Only a send that fails for the connection (OSError: uvicorn's ClientDisconnected) is taken as
    the client gone; any other exception is the handler's, and uvicorn logs it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        connection = _Connection(scope)
        _connection.set(connection)

        async def receiving():
            if connection.gone:
                return {"type": "websocket.disconnect", "code": 1006}
            message = await receive()
            connection.heard = connection.heard or message["type"] != "websocket.connect"
            if message["type"] == "websocket.disconnect" and message.get("code") not in _CLOSED_CLEANLY:
                connection.gone = True
                log.warning("%s: the client went away without closing it (the connection was lost, WebSocket code "
                            "%s); its episode is closed", connection, message.get("code"))
            return message

        async def sending(message) -> None:
            if connection.gone:
                return
            if message["type"] == "websocket.send":
                message = connection.coded(message)
            elif message["type"] == "websocket.close" and not connection.heard:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(receive(), timeout=10)
            try:
                await send(message)
            except OSError:
                connection.gone = True
                if message["type"] == "websocket.send":
                    why = ("the drain's grace ended" if connection.env is not None and connection.env.sessions.draining
                           else "the client went away")
                    log.warning("%s: %s before the answer to its last message; the answer is dropped and the "
                                "episode closed", connection, why)

        await self.app(scope, receiving, sending)


async def _refused(request: Request, exc: Refused) -> JSONResponse:
    """An HTTP request the server will not run: 503, why and the code (FastAPI would answer a bare 500)."""
    return JSONResponse({"detail": str(exc), "code": exc.code}, status_code=503)


def check_pool_devices(devices: list[str], device: str) -> None:
    """Check that a local pool on ``devices`` can evaluate the episodes (on ``device``: cuda or cpu).

    Args:
        devices: the pool's devices (``cpu``, ``cuda:N``).
        device: the kind the episodes evaluate on.

    Raises:
        ValueError: none of ``devices`` is of that kind. ``LocalPool`` itself refuses devices the
            machine lacks or names twice."""
    if not any(name.partition(":")[0] == device for name in devices):
        raise ValueError(f"--devices {','.join(devices)}: the episodes evaluate on {device}, and none of these is "
                         f"{'a cuda device' if device == 'cuda' else 'cpu'}")


class KernelEnvServer:
    """KernelAgent-v0 or KernelRefine-v0 as an OpenEnv server (``kernel-env serve`` makes one)::

        server = KernelEnvServer("agent", task="example/relu_add", language="cpp", device="cpu")
        report = server.run(listen("127.0.0.1", 8000), on_listening=print)   # until SIGTERM or SIGINT

    Args:
        env: "agent" (KernelAgent-v0) or "refine" (KernelRefine-v0).
        max_sessions: WebSocket sessions at once; openenv-core refuses one more (CAPACITY_REACHED).
        idle_timeout_s: an episode with no reset or step for this long is closed (None: never).
        drain_grace_s: how long a drain lets the steps in flight run on and be answered.
        pool: the kind of this process's shared pool ("local", "ray"), every session's.
        devices: instead, a local pool of the server's own on these devices (``cuda:1``,
            ``cuda:2``: keep the evaluations off the trainer's GPUs); only with ``pool="local"``.
        **env_options: the environment's keyword arguments (task, language, device, sandbox,
            max_turns, settings, ...), checked here rather than in every session.

    Raises:
        ValueError: an unknown ``env``; ``devices`` with a Ray pool, or devices this machine lacks,
            names twice or that hold none of the episodes' kind.
        EpisodeError: a language the device cannot run.
        And what the environment raises for a bad option (ValueError; TaskError for a ``task``
        that names no task)."""

    def __init__(self, env: str = "agent", *, max_sessions: int = 64, idle_timeout_s: float | None = 1800.0,
                 drain_grace_s: float = 60.0, pool: str = DEFAULT_POOL, devices: list[str] | None = None,
                 **env_options: Any):
        if env not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {env!r}; available: {', '.join(ENVIRONMENTS)}")
        if devices is not None and pool != "local":
            raise ValueError(f"--devices chooses the local pool's devices; a {pool} pool (--pool {pool}) runs on its "
                             "cluster's")
        self.name, action = ENVIRONMENTS[env]
        probe = make(self.name, **env_options)  # the options' errors here, not in every session
        check_device(probe.lang, probe.device)
        self.language, self.device = probe.language, probe.device
        if devices is not None:
            check_pool_devices(devices, self.device)
        self.drain_grace_s = drain_grace_s
        self.pool_kind = pool
        if devices is None:
            self.pool: GpuPool = shared_pool(pool)
        else:
            try:
                self.pool = LocalPool(devices=devices)
            except ValueError as exc:  # the local pool's: a device this machine lacks, or one named twice
                raise ValueError(f"--devices {exc}") from None
        #: The local pool's devices (a Ray pool's are its cluster's: None).
        self.pool_devices: list[str] | None = self.pool.devices if isinstance(self.pool, LocalPool) else None
        self.sessions = Sessions(idle_timeout_s)
        options = dict(env_options, task=probe.task, language=self.language, device=self.device, pool=self.pool)
        self._openenv = _OpenEnvServer(functools.partial(KernelEnvironment, self.name, self.sessions, options), action,
                                       KernelEnvObservation,
                                       concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions))
        self.app = FastAPI(title=f"kernel_env {self.name}", version=kernel_env.__version__)
        # Before openenv-core's routes: this /health is the one that answers (openenv-core's says only "healthy").
        self.app.get("/health", summary="Health, sessions and the drain (503 while draining)")(self.health)
        self._openenv.register_routes(self.app)
        self.app.add_exception_handler(Refused, _refused)  # over HTTP; over a WebSocket, _WebSocketSessions
        self.app.add_middleware(_WebSocketSessions)

    def health(self) -> JSONResponse:
        status = self.sessions.status()
        body = {"status": "draining" if status["draining"] else "healthy", "env": self.name, "language": self.language,
                "device": self.device, "pool": self.pool_kind, "pool_devices": self.pool_devices,
                "sessions": self._openenv.active_sessions, "max_sessions": self._openenv.max_concurrent_envs,
                "episodes": status["episodes"], "in_flight": status["in_flight"],
                "idle_timeout_s": self.sessions.idle_timeout_s}
        return JSONResponse(body, status_code=503 if status["draining"] else 200)

    def run(self, sock: socket.socket, *, on_listening: Callable[[str], None] = lambda url: None) -> DrainReport:
        """Serve until SIGTERM or SIGINT, then drain: refuse new resets and steps (``/health``
        answers 503), let the steps in flight run on for ``drain_grace_s``, close the pool (what
        still waits for an evaluation is answered as the evaluator's fault), close every connection
        (WebSocket code 1012), and close each episode as its last step returns.

        Args:
            sock: a bound socket (``listen``).
            on_listening: called with the server's URL once connections are accepted.

        Returns:
            How the drain went, once every episode is closed.

        Raises:
            RuntimeError: the HTTP server did not start (uvicorn's log says why)."""
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


@functools.cache
def _default_app() -> FastAPI:
    return KernelEnvServer().app


def __getattr__(name: str) -> Any:
    """``app``: KernelAgent-v0 served with the defaults (every reset names its task), built on first
    use, for ``uvicorn kernel_env.integrations.openenv:app`` (openenv.yaml's ``app``, which OpenEnv's
    tools run). ``kernel-env serve`` takes options and drains on SIGTERM, where uvicorn's own
    shutdown closes every session at once."""
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
