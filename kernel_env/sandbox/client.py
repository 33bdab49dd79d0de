"""The host side of the sandbox server's protocol, shared by every backend.

``server.py`` runs inside the isolation boundary and answers JSON lines on its stdin and
stdout. ``ServerSandbox`` implements the whole ``Sandbox`` contract on top of that: requests
and answers, timeouts, and restarting a server the agent killed. A backend only says how the
server is started (``_launch``, which returns the byte ``Channel`` to it) and how everything
it started is stopped (``_stop``); the local (bubblewrap) and docker backends differ in
nothing else. This module also fixes where the server and its files appear inside an
isolating sandbox, and the environment the agent's commands get.

Nothing here ever interprets a path the agent named: every file operation is a request the
server carries out inside the sandbox.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Protocol

from kernel_env import headers
from kernel_env.sandbox.base import BackgroundJob, ExecResult, FileInfo, SandboxError, readable
from kernel_env.sandbox.bwrap import python_executable
from kernel_env.workspace import PROTECTED, Workspace

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- layout inside a sandbox

SERVER = Path(__file__).with_name("server.py")
SHIMS = Path(__file__).with_name("bin")
SANDBOX_WORKDIR = "/workspace"
SANDBOX_STATE = "/run/kernel_env/state"
SANDBOX_SERVER = "/run/kernel_env/server.py"
SANDBOX_BIN = "/run/kernel_env/bin"
SANDBOX_BROKER = "/run/kernel_env/broker"
SANDBOX_HOME = "/tmp/home"
# Host variables that describe the toolchain (not the host's secrets): passed in where set.
TOOLCHAIN_VARIABLES = ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "KERNEL_ENV_CUDA_ARCH")
_RESPONSE_MARGIN_S = 30.0


def sandbox_environment(*, python_bin: str, shims: str, home: str, workdir: str, state: str, broker_socket: str | None,
                        headers: str | None = None, toolchain_variables: bool = True,
                        extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of the server and the agent's commands: a fixed PATH, HOME, locale,
    the server's settings (``KE_*``; ``KE_HEADERS``: where the sandbox sees the precompiled
    torch headers, see kernel_env.headers) and, with ``toolchain_variables``, the host's CUDA settings.
    Nothing else of the host's environment (no credentials, tokens or proxies) is in it."""
    path = [shims, python_bin, "/usr/local/cuda/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        "PATH": ":".join(path),
        "HOME": home,
        "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "agent", "TERM": "dumb",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
        "KE_WORKDIR": workdir, "KE_STATE": state, "KE_PROTECTED": ":".join(PROTECTED),
    }
    if broker_socket is not None:
        env["KE_BROKER"] = broker_socket
    if headers is not None:
        env["KE_HEADERS"] = headers
    if toolchain_variables:
        env.update({name: os.environ[name] for name in TOOLCHAIN_VARIABLES if name in os.environ})
    env.update(extra or {})
    return env


# ----------------------------------------------------------------------------- channels


class Channel(Protocol):
    """The byte stream to one running server: its stdin one way, its stdout the other."""

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the server's stdin. Raises OSError if the server is gone."""

    def read_line(self, timeout: float) -> bytes:
        """The server's next stdout line, without the newline. Raises TimeoutError when none
        arrives within ``timeout`` seconds, EOFError when the server's stdout ended."""

    def alive(self) -> bool:
        """False once the server is known to have exited. Never blocks."""

    def errors(self) -> str:
        """The end of what the server wrote to stderr, where the backend sees it (else "")."""


class PipeChannel:
    """A server that is a child process of ours, on its stdin and stdout pipes."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._buffer = b""

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if not readable(fd, remaining):
                raise TimeoutError
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def errors(self) -> str:
        return ""


# ----------------------------------------------------------------------------- the protocol


class _SandboxDied(SandboxError):
    """The server exited while a request was under way (the agent killed it, most likely)."""


class ServerSandbox(ABC):
    """A Sandbox whose work is done by ``server.py``, reached through a ``Channel``.

    Subclasses implement ``_launch`` (start the server; return its channel; raise SandboxError
    when it cannot start) and ``_stop`` (stop everything the server started; idempotent; also
    called after a failed ``_launch``). See ``kernel_env.sandbox.base.Sandbox`` for the contract.
    """

    workspace: Workspace
    workdir: str

    def __init__(self, workspace: Workspace, workdir: str):
        self.workspace = workspace
        self.workdir = workdir
        #: How often the server was restarted because it had died (or was first started lazily).
        self.restarts = 0
        self._channel: Channel | None = None
        self._lock = threading.RLock()
        self._next_id = 0

    # ----------------------------------------------------------------- backend hooks

    @abstractmethod
    def _launch(self) -> Channel:
        """Start the server; return the channel to its stdin/stdout. Raise SandboxError if it cannot start."""

    @abstractmethod
    def _stop(self) -> None:
        """Stop the server and everything it started; idempotent."""

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        with self._lock:
            if self._channel is not None and self._channel.alive():
                return
            self.close()
            headers.prepare(self.workspace.language.name)  # for this and later sandboxes' builds
            try:
                self._channel = self._launch()
            except BaseException:
                self._stop()
                raise
            try:
                self._call("ping", _timeout=60, _restart=False)
            except SandboxError as exc:
                self.close()
                raise SandboxError(f"the sandbox did not come up: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._channel = None
            self._stop()

    def _revive(self) -> None:
        self.close()
        self.restarts += 1
        log.info("sandbox for %s restarted (restart %d)", self.workspace.task.id, self.restarts)
        self.start()

    # ----------------------------------------------------------------- requests

    def _call(self, op: str, *, _timeout: float = 60.0, _restart: bool = True, **payload) -> dict:
        """Send one request and wait for its answer; restart the sandbox if the agent killed it."""
        with self._lock:
            if self._channel is None or not self._channel.alive():
                if not _restart:
                    raise SandboxError("the sandbox is not running")
                self._revive()
            channel = self._channel
            self._next_id += 1
            request = json.dumps({"id": self._next_id, "op": op, **payload}).encode() + b"\n"
            try:
                channel.send(request)
                line = channel.read_line(_timeout)
            except (EOFError, OSError) as exc:  # OSError covers BrokenPipeError and TimeoutError
                died = not channel.alive()
                errors = channel.errors().strip()
                self.close()
                if died:
                    raise _SandboxDied("the sandbox server exited" + (f": {errors[-2000:]}" if errors else "")) from None
                raise SandboxError(f"the sandbox stopped answering ({type(exc).__name__}); it was shut down") from None
            response = json.loads(line)
            if not response.get("ok"):
                raise SandboxError(response.get("error") or "the sandbox refused the request")
            return response

    def _checked(self, op: str, **payload) -> dict:
        try:
            return self._call(op, **payload)
        except _SandboxDied:
            self._revive()
            raise SandboxError("the sandbox had died and was restarted; background jobs were lost. Try again.") from None

    # ----------------------------------------------------------------- Sandbox API

    def exec(self, command: str, timeout: float = 180.0, *, max_output: int = 30_000) -> ExecResult:
        if not isinstance(command, str) or not command.strip():
            raise SandboxError("the command is empty")
        try:
            r = self._call("exec", command=command, timeout=timeout, max_output=max_output, _timeout=timeout + _RESPONSE_MARGIN_S)
        except _SandboxDied:
            self._revive()
            return ExecResult(output="", exit_code=None, note="the command killed the sandbox's shell server; the sandbox was restarted with the shell state of the previous command (background jobs were lost)")
        return ExecResult(output=r["output"], exit_code=r["exit_code"], timed_out=r["timed_out"], truncated=r["truncated"],
                          output_bytes=r["output_bytes"], duration_s=r["duration_s"])

    def start_background(self, command: str) -> str:
        return self._checked("bg_start", command=command)["job_id"]

    def background_output(self, job_id: str, *, max_output: int = 30_000) -> BackgroundJob:
        return _job(self._checked("bg_output", job_id=job_id, max_output=max_output))

    def kill_background(self, job_id: str) -> BackgroundJob:
        return _job(self._checked("bg_kill", job_id=job_id))

    def read_bytes(self, path: str, *, limit: int = 10_000_000) -> bytes:
        return base64.b64decode(self._checked("read", path=path, limit=limit)["data"])

    def write_bytes(self, path: str, data: bytes) -> None:
        self._checked("write", path=path, data=base64.b64encode(data).decode())

    def stat(self, path: str) -> FileInfo | None:
        info = self._checked("stat", path=path)["info"]
        return FileInfo(**info) if info else None

    def glob(self, pattern: str, base: str = ".") -> list[FileInfo]:
        return [FileInfo(**f) for f in self._checked("glob", pattern=pattern, base=base)["files"]]


def _job(r: dict) -> BackgroundJob:
    return BackgroundJob(job_id=r["job_id"], command=r["command"], running=r["running"], exit_code=r["exit_code"],
                         new_output=r["new_output"], truncated=r["truncated"])


def python_bin_dir() -> str:
    """The directory of the running interpreter (the venv's bin), put on the sandbox's PATH."""
    return str(Path(python_executable()).parent)
