"""The host side of the fork servers that evaluation children are forked from.

Children are forked from a fork server (``Zygote``, running ``child/zygote.py``) that imported
torch, Triton and the harness's child modules once: a child costs a fork and, on a GPU, its own
CUDA context, not a fresh interpreter's seconds of imports. The server runs in a bubblewrap
sandbox of its own that sees ``child/`` (read-only) and the jobs' folders, and runs no task or
candidate code; ``zygote_for`` keeps one a kind of child a process. Each child it forks is
isolated as a bubblewrap sandbox of its own would be (``child/zygote.py`` says how); the
child's side of the conversation is ``children.py``'s. Without bubblewrap the children are
plain forks (the agent sandbox has already warned about that).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from kernel_env.sandbox.bwrap import (
    PidNamespace,
    base_argv,
    bubblewrap_problem,
    gpu_device_binds,
    python_executable,
    spawn,
)

#: The process boundary: the one folder bound into the fork server and its children (child/__init__.py).
CHILD_DIR = Path(__file__).resolve().parent / "child"
#: What each role's child sees of its job (read-only, writable): the judge writes the reference's
#: seeded weights and init inputs there; the worker reads the snapshot (a candidate's) and its copy
#: of the weights.
ROLE_DIRS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "judge": ((), ("/job/ref",)),
    "worker": (("/job/snapshot",), ("/job/cand",)),
}
# A fork server's imports took 8-13 s of a core on a loaded H100 machine; its first GPU child compiles too.
_ZYGOTE_START_TIMEOUT_S = 600.0
_CHILD_START_TIMEOUT_S = 60.0


class ChildError(RuntimeError):
    """The child died, hung or broke the protocol; the message says which."""


def child_env(python: str) -> dict[str, str]:
    return {"PATH": f"{Path(python).parent}:/usr/local/cuda/bin:/usr/bin:/bin", "HOME": "/tmp/home", "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def _pidfd_pid(pidfd: int) -> int:
    """The pid, in this process's namespace, of the process a pidfd refers to."""
    with open(f"/proc/self/fdinfo/{pidfd}") as info:
        for line in info:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
    raise ChildError("the child ended as it started")


class Zygote:
    """A fork server (``zygote.py``) for children of one kind: one environment (whatever
    CUDA_VISIBLE_DEVICES says: it is set per child, before the child's CUDA starts), GPU or not,
    and the same folders shared by all of them (``shared``: target -> host folder, bound
    writable; the synthesis filter's compile cache).

    The server runs in a bubblewrap sandbox of its own whose /jobs is ``self.jobs``: every child's
    folder lives there, and each child sees its own directories and none of the others'."""

    def __init__(self, env: dict[str, str], *, gpu: bool, shared: dict[str, Path]):
        self.folder = Path(tempfile.mkdtemp(prefix="kernel_env-zygote-"))
        self.jobs = self.folder / "jobs"
        self.jobs.mkdir()
        self.isolated = bubblewrap_problem() is None
        self._lock = threading.Lock()
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python = python_executable()
        server_env = {**child_env(python), **env, "KE_ZYGOTE_FD": str(theirs.fileno()),
                      "KE_ISOLATE": "1" if self.isolated else "", "KE_GPU": "1" if gpu else ""}
        command = [python, "-I", "-B"]
        if self.isolated:
            argv = base_argv(self.folder / "identity", host_proc=True, die_with_parent=False)
            argv += gpu_device_binds() if gpu else []
            argv += ["--ro-bind", str(CHILD_DIR), "/run/kernel_env/child", "--bind", str(self.jobs), "/jobs"]
            for target in sorted({t for dirs in ROLE_DIRS.values() for group in dirs for t in group}):
                argv += ["--dir", target]  # where a child's own directories are bound
            for target, source in sorted(shared.items()):
                argv += ["--bind", str(source), target]
            argv += ["--chdir", "/tmp", "--clearenv"]
            for key, value in server_env.items():
                argv += ["--setenv", key, value]
            argv += command + ["/run/kernel_env/child/zygote.py"]
            popen_env = {"PATH": "/usr/bin:/bin"}
        else:
            argv = command + [str(CHILD_DIR / "zygote.py")]
            popen_env = {**os.environ, **server_env}
        self.log_path = self.folder / "zygote.log"
        # No die-with-parent (it fires when the starting *thread* ends): the server ends when this
        # process closes its socket or dies, and the end of its pid namespace takes every child with it.
        with open(self.log_path, "wb") as log:
            options = dict(stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=popen_env,
                           pass_fds=(theirs.fileno(),), cwd=self.folder)
            self._namespace: PidNamespace | None = None
            if self.isolated:
                self.proc, self._namespace = spawn(argv, **options)
            else:
                self.proc = subprocess.Popen(argv, **options)
        theirs.close()
        self._socket.settimeout(_ZYGOTE_START_TIMEOUT_S)
        try:
            answer = self._socket.recv(4096)
        except (TimeoutError, OSError) as exc:
            answer = f"error no answer in {_ZYGOTE_START_TIMEOUT_S:.0f} s ({exc})".encode()
        if answer != b"ready":
            self.close()
            problem = answer.decode("utf-8", "replace").removeprefix("error ") or "it ended"
            raise ChildError(f"the evaluation fork server did not start: {problem}" + self._log_tail())
        self._socket.settimeout(None)

    def _log_tail(self) -> str:
        try:
            tail = self.log_path.read_bytes()[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return f":\n{tail}" if tail else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ended_within(self, seconds: float) -> bool:
        """Whether the server has ended, or ends within ``seconds``: its children die before it
        is seen to (the end of a pid namespace waits for every process in it)."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def fork(self, request: dict, fds: Sequence[int], place: Callable[[int], None]) -> _Forked:
        """Fork a child for ``request`` (role, binds, env, rlimits, cwd, preload: see zygote.py)
        with ``fds`` (``zygote.CHILD_FDS`` but the control socket). ``place(pid)`` is called with
        the host pid of the child's warden before the child exists (to put it in a cgroup)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                socket.send_fds(self._socket, [json.dumps(request).encode()], [*fds, theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise ChildError(f"the evaluation fork server is gone ({exc})" + self._log_tail()) from None
        finally:
            theirs.close()
        return _Forked(ours, place)

    def close(self) -> None:
        """End the server and every child it forked (its pid namespace), and remove its folder."""
        self._socket.close()
        if self._namespace is not None:
            self._namespace.kill()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Forked:
    """A child forked by a Zygote, as much of subprocess.Popen as Child uses (``pid``, ``poll``,
    ``kill``, ``wait``); its warden reports how it ended on the control socket."""

    def __init__(self, control: socket.socket, place: Callable[[int], None]):
        self._control = control
        self.returncode: int | None = None
        self._pidfd = -1
        try:
            control.settimeout(_CHILD_START_TIMEOUT_S)
            warden = self._expect(b"warden")
            try:
                place(_pidfd_pid(warden))
            finally:
                os.close(warden)
            control.sendall(b"go")
            self._pidfd = self._expect(b"child")
            self.pid = _pidfd_pid(self._pidfd)
            control.settimeout(None)
        except BaseException:
            self.close()
            raise

    def _expect(self, kind: bytes) -> int:
        try:
            message, fds, _, _ = socket.recv_fds(self._control, 4096, 1)
        except (TimeoutError, OSError) as exc:
            raise ChildError(f"the child did not start in {_CHILD_START_TIMEOUT_S:.0f} s ({exc})") from None
        if message == kind and len(fds) == 1:
            return fds[0]
        for fd in fds:
            os.close(fd)
        if message.startswith(b"error "):
            raise ChildError(f"the child could not be started: {message[6:].decode('utf-8', 'replace')}")
        raise ChildError("the evaluation fork server ended before the child started")

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(block=False)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._read_status(block=True)
        return self.returncode

    def _read_status(self, *, block: bool) -> None:
        try:
            message = self._control.recv(64, 0 if block else socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            message = b""
        if message.startswith(b"exit "):
            self.returncode = int(message[5:])
        elif not message:  # the warden is gone without a word: only a kill does that
            self.returncode = -signal.SIGKILL

    def pid_namespace(self) -> PidNamespace:
        """The child's pid namespace, held through the child: it is the namespace's init."""
        return PidNamespace(os.dup(self._pidfd), self.pid)

    def kill(self) -> None:
        if self.returncode is None and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        self._control.close()


_zygotes: dict[tuple, Zygote] = {}
_zygote_locks: dict[tuple, threading.Lock] = {}
_zygotes_lock = threading.Lock()
_zygotes_owner = os.getpid()


def zygote_for(env: dict[str, str], *, gpu: bool, shared: dict[str, Path] | None = None) -> Zygote:
    """This process's fork server for children of this kind, started on first use (and again if it died)."""
    shared = shared or {}
    kind = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    key = (tuple(sorted(kind.items())), gpu, tuple(sorted((t, str(s)) for t, s in shared.items())))
    global _zygotes_owner
    with _zygotes_lock:
        if _zygotes_owner != os.getpid():  # a fork of the process that started them: theirs, not ours
            _zygotes.clear()
            _zygote_locks.clear()
            _zygotes_owner = os.getpid()
        lock = _zygote_locks.setdefault(key, threading.Lock())
    with lock:
        server = _zygotes.get(key)
        if server is None or not server.alive():
            if server is not None:
                server.close()
            server = Zygote(kind, gpu=gpu, shared=shared)
            with _zygotes_lock:
                _zygotes[key] = server
        return server


def close_zygotes() -> None:
    """End every fork server of this process, and their children."""
    with _zygotes_lock:
        servers = list(_zygotes.values()) if _zygotes_owner == os.getpid() else []
        _zygotes.clear()
    for server in servers:
        server.close()


atexit.register(close_zygotes)
