"""The ``local`` sandbox: bubblewrap on this host (the embedded default).

What the agent's processes get: the toolchain read-only (/usr, the Python installation,
CUDA), a handful of /etc files, a private /tmp and /proc, the workspace writable with its
protected files mounted read-only on top, no network, their own pid/ipc/uts namespaces,
uid 1000, no capabilities, a new session (no terminal injection), resource limits and,
where this host allows, a cgroup. Everything dies with the host process (``--die-with-parent``)
and with ``close()``.

Where bubblewrap cannot run, the sandbox says so once, loudly, and runs the same server
directly: resource limits and a clean environment, but no file-system isolation.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path

from kernel_env.sandbox.bwrap import PidNamespace, base_argv, bubblewrap_problem, spawn
from kernel_env.sandbox.base import BackgroundJob, ExecResult, FileInfo, SandboxError
from kernel_env.sandbox.limits import Cgroup, Limits
from kernel_env.workspace import PROTECTED, Workspace

log = logging.getLogger(__name__)

SERVER = Path(__file__).with_name("server.py")
SANDBOX_WORKDIR = "/workspace"
SANDBOX_STATE = "/run/kernel_env/state"
SANDBOX_SERVER = "/run/kernel_env/server.py"
SANDBOX_BIN = "/run/kernel_env/bin"
SANDBOX_BROKER = "/run/kernel_env/broker"
SHIMS = Path(__file__).with_name("bin")
_RESPONSE_MARGIN_S = 30.0


@functools.cache
def _warn_unisolated(problem: str) -> None:
    message = f"kernel_env: SANDBOX NOT ISOLATED: {problem}. Agent commands will run directly on this host with only resource limits."
    if log.hasHandlers():  # else logging's last-resort handler would print the same line a second time
        log.warning(message)
    print(f"\n{'!' * 80}\n{message}\n{'!' * 80}\n", file=sys.stderr)


class LocalSandbox:
    """Bubblewrap sandbox on one workspace. See ``kernel_env.sandbox.base.Sandbox`` for the contract."""

    def __init__(self, workspace: Workspace, *, limits: Limits | None = None, network: bool = False,
                 extra_ro_binds: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 require_isolation: bool = False, broker_dir: Path | None = None):
        self.workspace = workspace
        self.limits = limits or Limits()
        self.network = network
        self.extra_ro_binds = extra_ro_binds
        self.extra_env = env or {}
        self.broker_dir = broker_dir
        problem = bubblewrap_problem()
        if problem and require_isolation:
            raise SandboxError(f"isolation required but {problem}")
        self.isolated = problem is None
        if problem:
            _warn_unisolated(problem)
        self.workdir = SANDBOX_WORKDIR if self.isolated else str(workspace.path)
        self._state = SANDBOX_STATE if self.isolated else str(workspace.state_dir)
        self._proc: subprocess.Popen | None = None
        self._namespace: PidNamespace | None = None
        self._cgroup: Cgroup | None = None
        self._lock = threading.RLock()
        self._next_id = 0
        self._buffer = b""
        self.restarts = 0

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalSandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._cgroup = Cgroup.create(self.limits)
            options = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           env=self._environment() if not self.isolated else {"PATH": "/usr/bin:/bin"},
                           cwd=self.workspace.path, preexec_fn=self._preexec, close_fds=True)
            try:
                if self.isolated:
                    self._proc, self._namespace = spawn(self._argv(), **options)
                else:
                    self._proc = subprocess.Popen(self._argv(), **options)
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox: {exc}") from None
            self._buffer = b""
            try:
                self._call("ping", _timeout=60, _restart=False)
            except SandboxError as exc:
                self.close()
                raise SandboxError(f"the sandbox did not come up: {exc}") from None

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            namespace, self._namespace = self._namespace, None
            if proc is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
                # bwrap's own process may exit before the namespace is empty: kill and wait for that.
                if namespace is not None and not namespace.kill():
                    log.warning("sandbox for %s: processes were still dying 10 s after close()", self.workspace.task.id)
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
            if self._cgroup is not None:
                self._cgroup.destroy()
                self._cgroup = None

    def _preexec(self) -> None:
        if self._cgroup is not None:
            self._cgroup.enter()
        self.limits.apply_rlimits()

    # ----------------------------------------------------------------- command line

    def _environment(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        shims = SANDBOX_BIN if self.isolated else str(SHIMS)
        path = [shims, venv_bin, "/usr/local/cuda/bin", "/usr/local/bin", "/usr/bin", "/bin"]
        env = {
            "PATH": ":".join(path),
            "HOME": "/tmp/home" if self.isolated else str(self.workspace.state_dir / "home"),
            "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "agent", "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "KE_WORKDIR": self.workdir, "KE_STATE": self._state, "KE_PROTECTED": ":".join(PROTECTED),
        }
        if self.broker_dir is not None:
            env["KE_BROKER"] = f"{SANDBOX_BROKER if self.isolated else self.broker_dir}/broker.sock"
        for name in ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "KERNEL_ENV_CUDA_ARCH"):
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(self.extra_env)
        return env

    def interactive_argv(self) -> list[str]:
        """Command line for a person's interactive shell in this sandbox (same mounts, a terminal)."""
        shell = ["bash", "--noprofile", "--norc", "-i"]
        if not self.isolated:
            return shell
        argv = self._argv(shell)
        argv.remove("--new-session")  # a person at a terminal needs job control
        # A person's terminal, not the agent's TERM=dumb, and a prompt that says where they are.
        at = len(argv) - len(shell)
        argv[at:at] = ["--setenv", "TERM", os.environ.get("TERM") or "xterm", "--setenv", "PS1", r"[kernel-env \W]\$ "]
        return argv

    def _argv(self, command: list[str] | None = None) -> list[str]:
        python = sys.executable
        command = command or [python, "-I", "-B", SANDBOX_SERVER if self.isolated else str(SERVER)]
        if not self.isolated:
            self.workspace.state_dir.mkdir(exist_ok=True)
            (self.workspace.state_dir / "home").mkdir(exist_ok=True)
            return command

        ws = self.workspace
        state = ws.state_dir
        argv = base_argv(state, network=self.network, extra_ro_binds=self.extra_ro_binds)
        argv += [
            "--bind", str(state), SANDBOX_STATE,
            "--ro-bind", str(SERVER), SANDBOX_SERVER,
            "--ro-bind", str(SHIMS), SANDBOX_BIN,
            "--bind", str(ws.path), SANDBOX_WORKDIR,
        ]
        if self.broker_dir is not None:
            argv += ["--ro-bind", str(self.broker_dir), SANDBOX_BROKER]
        for name in PROTECTED:
            if (ws.path / name).exists():
                argv += ["--ro-bind", str(ws.path / name), f"{SANDBOX_WORKDIR}/{name}"]
        argv += ["--chdir", SANDBOX_WORKDIR, "--clearenv"]
        for key, value in self._environment().items():
            argv += ["--setenv", key, value]
        return argv + command

    # ----------------------------------------------------------------- protocol

    def _call(self, op: str, *, _timeout: float = 60.0, _restart: bool = True, **payload) -> dict:
        """Send one request and wait for its answer; restart the sandbox if the agent killed it."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if not _restart:
                    raise SandboxError("the sandbox is not running")
                self._revive()
            self._next_id += 1
            request = json.dumps({"id": self._next_id, "op": op, **payload}).encode() + b"\n"
            try:
                self._proc.stdin.write(request)
                self._proc.stdin.flush()
                line = self._read_line(_timeout)
            except (BrokenPipeError, EOFError, OSError, TimeoutError) as exc:
                died = self._proc.poll() is not None
                self.close()
                if died:
                    raise _SandboxDied() from None
                raise SandboxError(f"the sandbox stopped answering ({type(exc).__name__}); it was shut down") from None
            response = json.loads(line)
            if not response.get("ok"):
                raise SandboxError(response.get("error") or "the sandbox refused the request")
            return response

    def _read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        stdout = self._proc.stdout
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                if not sel.select(remaining):
                    raise TimeoutError
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _revive(self) -> None:
        self.close()
        self.restarts += 1
        log.info("sandbox for %s restarted (restart %d)", self.workspace.task.id, self.restarts)
        self.start()

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

    def _checked(self, op: str, **payload) -> dict:
        try:
            return self._call(op, **payload)
        except _SandboxDied:
            self._revive()
            raise SandboxError("the sandbox had died and was restarted; background jobs were lost. Try again.") from None


class _SandboxDied(Exception):
    pass


def _job(r: dict) -> BackgroundJob:
    return BackgroundJob(job_id=r["job_id"], command=r["command"], running=r["running"], exit_code=r["exit_code"],
                         new_output=r["new_output"], truncated=r["truncated"])
