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

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

from kernel_env.headers import SANDBOX_HEADERS, host_folder
from kernel_env.sandbox.base import SandboxError
from kernel_env.sandbox.bwrap import (
    SANDBOX_UID,
    PidNamespace,
    base_argv,
    bubblewrap_problem,
    python_executable,
    spawn,
)
from kernel_env.sandbox.client import (
    SANDBOX_BIN,
    SANDBOX_BROKER,
    SANDBOX_HOME,
    SANDBOX_SERVER,
    SANDBOX_STATE,
    SANDBOX_WORKDIR,
    SERVER,
    SHIMS,
    PipeChannel,
    ServerSandbox,
    python_bin_dir,
    sandbox_environment,
)
from kernel_env.sandbox.limits import Cgroup, Limits
from kernel_env.workspace import PROTECTED, Workspace

log = logging.getLogger(__name__)

__all__ = ["LocalSandbox", "bubblewrap_problem", "SANDBOX_WORKDIR", "SANDBOX_STATE", "SANDBOX_SERVER", "SANDBOX_BIN",
           "SANDBOX_BROKER", "SERVER", "SHIMS"]


@functools.cache
def _warn_unisolated(problem: str) -> None:
    message = f"kernel_env: SANDBOX NOT ISOLATED: {problem}. Agent commands will run directly on this host with only resource limits."
    if log.hasHandlers():  # else logging's last-resort handler would print the same line a second time
        log.warning(message)
    print(f"\n{'!' * 80}\n{message}\n{'!' * 80}\n", file=sys.stderr)


class LocalSandbox(ServerSandbox):
    """Bubblewrap sandbox on one workspace. See ``kernel_env.sandbox.base.Sandbox`` for the contract."""

    def __init__(self, workspace: Workspace, *, limits: Limits | None = None, network: bool = False,
                 extra_ro_binds: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 require_isolation: bool = False, broker_dir: Path | None = None):
        problem = bubblewrap_problem()
        if problem and require_isolation:
            raise SandboxError(f"isolation required but {problem}")
        self.isolated = problem is None
        if problem:
            _warn_unisolated(problem)
        super().__init__(workspace, SANDBOX_WORKDIR if self.isolated else str(workspace.path))
        self.limits = limits or Limits()
        self.network = network
        self.extra_ro_binds = extra_ro_binds
        self.extra_env = env or {}
        self.broker_dir = broker_dir
        #: The agent's uid inside the sandbox.
        self.uid = SANDBOX_UID
        self._state = SANDBOX_STATE if self.isolated else str(workspace.state_dir)
        self._proc: subprocess.Popen | None = None
        self._namespace: PidNamespace | None = None
        self._cgroup: Cgroup | None = None

    # ----------------------------------------------------------------- lifecycle

    def _launch(self) -> PipeChannel:
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
        return PipeChannel(self._proc)

    def _stop(self) -> None:
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
        broker = None
        if self.broker_dir is not None:
            broker = f"{SANDBOX_BROKER if self.isolated else self.broker_dir}/broker.sock"
        return sandbox_environment(
            python_bin=python_bin_dir(), shims=SANDBOX_BIN if self.isolated else str(SHIMS),
            home=SANDBOX_HOME if self.isolated else str(self.workspace.state_dir / "home"),
            workdir=self.workdir, state=self._state, broker_socket=broker,
            headers=(SANDBOX_HEADERS if self.isolated else str(folder)) if (folder := host_folder()) else None,
            extra=self.extra_env,
        )

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
        python = python_executable()
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
        if (headers := host_folder()) is not None:
            argv += ["--ro-bind", str(headers), SANDBOX_HEADERS]
        for name in PROTECTED:
            if (ws.path / name).exists():
                argv += ["--ro-bind", str(ws.path / name), f"{SANDBOX_WORKDIR}/{name}"]
        argv += ["--chdir", SANDBOX_WORKDIR, "--clearenv"]
        for key, value in self._environment().items():
            argv += ["--setenv", key, value]
        return argv + command
