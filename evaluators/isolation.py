"""Starting evaluation child processes in isolation, and talking to them.

Children are forked from a fork server (``Zygote``, running ``zygote.py``) that imported torch,
Triton and the harness's modules once: a child costs a fork and, on a GPU, its own CUDA context,
not a fresh interpreter's seconds of imports. Each child (a ``reference`` or a ``candidate``
runner) is isolated as a bubblewrap sandbox of its own would be: the toolchain read-only, the
runner's directory read-only, exactly the job directories it needs (read-only or writable), the
GPU device nodes, a private /tmp, its own pid, network, IPC and user namespaces with no
capability, and the sandbox's resource limits (zygote.py says how). Without bubblewrap the
children are plain forks (the agent sandbox has already warned about that).

The parent speaks JSON lines to the child's stdin and reads answers from a private pipe;
the child's stdout and stderr (the candidate's prints) go to a log file. Timing marks travel
on a datagram socket of their own whose messages the kernel stamps when the child sends
them, so the parent's clock bracket of a timed call does not depend on when the parent got
to read them (a busy parent, with many episodes in one process, reads late). Answers and
marks are signed with a key the parent sends first, before the child imports anything under
test (``runner.Channel``): the child's descriptors are open to the candidate's code, its key
is not.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO

from kernel_env.sandbox.bwrap import PidNamespace, base_argv, bubblewrap_problem, gpu_device_binds, python_executable, spawn
from kernel_env.sandbox.limits import Cgroup, Limits

RUNNER_DIR = Path(__file__).resolve().parent
#: What each role's child sees of its job (read-only, writable): the reference writes its outputs
#: where the candidate never looks; the candidate reads the snapshot and writes its own outputs.
ROLE_DIRS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "reference": ((), ("/job/ref",)),
    "candidate": (("/job/snapshot",), ("/job/cand",)),
}
# Receive timestamps of the marks socket (SCM_TIMESTAMPNS == SO_TIMESTAMPNS; 35 on x86-64 and arm64).
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
# A fork server's imports took 8-13 s of a core on a loaded H100 machine; its first GPU child compiles too.
_ZYGOTE_START_TIMEOUT_S = 600.0
_CHILD_START_TIMEOUT_S = 60.0


def _host_memory_share(fraction: float) -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * fraction)


class ChildError(RuntimeError):
    """The child died, hung or broke the protocol; the message says which."""


def _child_env(python: str) -> dict[str, str]:
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

    def __init__(self, env: dict[str, str], *, gpu: bool, shared: dict[str, Path], prime_device: str = ""):
        self.folder = Path(tempfile.mkdtemp(prefix="kernel_env-zygote-"))
        self.jobs = self.folder / "jobs"
        self.jobs.mkdir()
        self.isolated = bubblewrap_problem() is None
        self._lock = threading.Lock()
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python = python_executable()
        server_env = {**_child_env(python), **env, "KE_ZYGOTE_FD": str(theirs.fileno()),
                      "KE_ISOLATE": "1" if self.isolated else "", "KE_PRIME_DEVICE": prime_device}
        command = [python, "-I", "-B"]
        if self.isolated:
            argv = base_argv(self.folder / "identity", host_proc=True, die_with_parent=False)
            argv += gpu_device_binds() if gpu else []
            argv += ["--ro-bind", str(RUNNER_DIR), "/run/kernel_env/evaluators", "--bind", str(self.jobs), "/jobs"]
            for target in sorted({t for dirs in ROLE_DIRS.values() for group in dirs for t in group}):
                argv += ["--dir", target]  # where a child's own directories are bound
            for target, source in sorted(shared.items()):
                argv += ["--bind", str(source), target]
            argv += ["--chdir", "/tmp", "--clearenv"]
            for key, value in server_env.items():
                argv += ["--setenv", key, value]
            argv += command + ["/run/kernel_env/evaluators/zygote.py"]
            popen_env = {"PATH": "/usr/bin:/bin"}
        else:
            argv = command + [str(RUNNER_DIR / "zygote.py")]
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
            server = Zygote(kind, gpu=gpu, shared=shared, prime_device=env.get("CUDA_VISIBLE_DEVICES", "") if gpu else "")
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


class Child:
    """One isolated evaluation process, forked by ``zygote`` into ``folder`` (a folder of its ``jobs``).

    ``dirs``: the job directories it sees (target -> writable), each the folder's subfolder of
    the target's name; ``preload``: make its CUDA context and the harness's kernels ready before
    any job (a spare)."""

    def __init__(self, role: str, zygote: Zygote, folder: Path, *, dirs: dict[str, bool], env: dict[str, str],
                 shared: dict[str, Path] | None = None, limits: Limits | None = None, preload: bool = False):
        self.role = role
        self.folder = folder
        self.host_paths = {target: folder / PurePosixPath(target).name for target in dirs} | dict(shared or {})
        self.isolated = zygote.isolated
        self.paths = {target: target if self.isolated else str(source) for target, source in self.host_paths.items()}
        self._closed = False
        self.log_path = folder / f"{role}.log"
        # CUDA maps a huge address space, so the per-process cap is off; the cgroup bounds real
        # memory to most of this machine's, so a runaway candidate cannot take the host down.
        self.limits = limits or Limits(memory_bytes=_host_memory_share(0.75), address_space_bytes=1 << 46, processes=4096)
        self._cgroup = Cgroup.create(self.limits)
        self._log = open(self.log_path, "wb")
        self._buffer = b""
        stdin_read, stdin_write = os.pipe()
        self._reply_fd, reply_write = os.pipe()
        self._marks, child_marks = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._marks.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._marks.setblocking(False)
        self.stdin: IO[bytes] = os.fdopen(stdin_write, "wb")
        request = {"role": role, "binds": [(target, f"{folder.name}/{PurePosixPath(target).name}", writable)
                                           for target, writable in dirs.items()],
                   "env": {**_child_env(python_executable()), **env}, "rlimits": self.limits.rlimits(),
                   "cwd": "/tmp" if self.isolated else str(folder), "preload": preload}
        self._namespace: PidNamespace | None = None
        try:
            self.proc = zygote.fork(request, (stdin_read, self._log.fileno(), reply_write, child_marks.fileno()),
                                    place=self._cgroup.add if self._cgroup is not None else lambda pid: None)
        except BaseException:
            self._release()
            raise
        finally:
            os.close(stdin_read)
            os.close(reply_write)
            child_marks.close()
        if self.isolated:
            self._namespace = self.proc.pid_namespace()
        self._key = secrets.token_bytes(32)
        self._send("start", self._key.hex())

    @classmethod
    def spawn(cls, role: str, *, env: dict[str, str], gpu: bool, label: str = "ke", preload: bool = False,
              shared: dict[str, Path] | None = None) -> Child:
        """A ``role`` child (see ROLE_DIRS) in a new folder of its own, ``<label>-<role>-<random>``
        among its fork server's jobs; ``host_paths`` says where the host sees each of its
        directories, and ``discard()`` removes the folder with the process."""
        zygote = zygote_for(env, gpu=gpu, shared=shared)
        folder = Path(tempfile.mkdtemp(prefix=f"{label}-{role}-", dir=zygote.jobs))
        read_only, writable = ROLE_DIRS[role]
        dirs = {target: False for target in read_only} | {target: True for target in writable}
        for target in dirs:
            (folder / PurePosixPath(target).name).mkdir()
        try:
            return cls(role, zygote, folder, dirs=dirs, env=env, shared=shared, preload=preload)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def path(self, target: str) -> str:
        """Where the child sees a bound directory."""
        return self.paths[target]

    def call(self, cmd: str, timeout: float, *, feed: Sequence[dict] = (), **payload) -> tuple[dict, list[tuple[str, int, float]]]:
        """Send a command; return its answer and the marks the child sent on the way, each with
        the kernel's clock reading (seconds) of the moment the child sent it.

        ``feed[k]`` goes to the child as one more line once its mark ``end:k`` has arrived, and not
        before: a timing run's next seed exists in the child only after the call before has ended.
        (A mark sent early to get ahead is a duplicate when the real one comes, which the clock
        check refuses.)"""
        self._send(cmd, {"cmd": cmd, **payload})
        marks: list[tuple[str, int, float]] = []
        fed = 0

        def on_marks() -> None:
            nonlocal fed
            while fed < len(feed) and any(kind == "end" and k == fed for kind, k, _ in marks):
                self._send(cmd, feed[fed])
                fed += 1

        line = self._read_line(cmd, timeout, marks, on_marks)
        self._drain_marks(marks)  # every mark was sent before the answer, so all are queued by now
        text, _, mac = line.decode("utf-8", "replace").rpartition("\t")
        if not hmac.compare_digest(mac, self._sign(text)):
            raise ChildError(f"the {self.role} process sent an answer to {cmd} that the harness did not write "
                             "(something in it wrote to the harness's channel)")
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            raise ChildError(f"the {self.role} process broke the protocol during {cmd}") from None
        if not isinstance(answer, dict):
            raise ChildError(f"the {self.role} process broke the protocol during {cmd}")
        return answer, marks

    def _sign(self, text: str) -> str:
        return hmac.digest(self._key, text.encode(), "sha256").hex()[:32]

    def _send(self, cmd: str, message: dict | str) -> None:
        try:
            self.stdin.write(((message if isinstance(message, str) else json.dumps(message)) + "\n").encode())
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChildError(self._death_note(f"the {self.role} process died during {cmd}")) from None

    def _read_line(self, cmd: str, timeout: float, marks: list[tuple[str, int, float]], on_marks) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise ChildError(f"{cmd} took longer than {timeout:.0f}s and was killed (a hang, a deadlock or an endless loop?)")
            with selectors.DefaultSelector() as sel:
                sel.register(self._reply_fd, selectors.EVENT_READ)
                sel.register(self._marks, selectors.EVENT_READ)
                ready = {key.fileobj for key, _ in sel.select(min(remaining, 1.0))}
            if self._marks in ready:
                self._drain_marks(marks)  # a full queue would block the child
                on_marks()
            if self._reply_fd not in ready:
                if not ready and self.proc.poll() is not None:
                    raise ChildError(self._death_note(f"the {self.role} process died during {cmd}"))
                continue
            chunk = os.read(self._reply_fd, 1 << 20)
            if not chunk:
                self.proc.wait()
                raise ChildError(self._death_note(f"the {self.role} process died during {cmd}"))
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _drain_marks(self, marks: list[tuple[str, int, float]]) -> None:
        """Read the queued marks (``start:K`` / ``end:K``) with their send-time stamps."""
        while True:
            try:
                data, ancillary, _, _ = self._marks.recvmsg(64, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            stamp = next((struct.unpack("qq", raw[:16]) for level, kind, raw in ancillary
                          if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16), None)
            text, _, mac = data.decode("ascii", "replace").rpartition(":")
            kind, _, k = text.partition(":")
            if stamp is None or not k.isdigit() or not hmac.compare_digest(mac, self._sign(text)):
                marks.append(("malformed", -1, 0.0))  # the clock check refuses a run with any
                continue
            marks.append((kind, int(k), stamp[0] + stamp[1] * 1e-9))

    def _death_note(self, what: str) -> str:
        code = self.proc.poll()
        if code is None:
            return what
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            how = f"killed by {name}"
        else:
            how = f"exit code {code}"
        return f"{what} ({how})" + (f":\n{self.log_tail()}" if self.log_tail() else "")

    def log_tail(self, limit: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
                data = handle.read(limit)
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def freeze(self) -> bool:
        """Stop every process of the child (see sharing.py): through its cgroup where this host lets
        one be frozen, else with SIGSTOP to each process of its pid namespace; False where neither
        is possible (no isolation) or the child has ended."""
        if self._closed or self.proc.poll() is not None:
            return False
        if self._cgroup is not None and self._cgroup.freeze():
            return True
        return self._namespace is not None and self._namespace.stop() > 0

    def thaw(self) -> None:
        if self._cgroup is not None:
            self._cgroup.thaw()
        if self._namespace is not None:
            self._namespace.signal(signal.SIGCONT)

    def kill(self) -> None:
        """End the child and everything it started (its whole pid namespace when isolated)."""
        if self._namespace is not None:
            self._namespace.kill()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """End the process (its folder, if it has one, stays: see ``discard``).

        Killed, not asked to exit: everything it was to hand over is in its answers and its
        folder already, and an orderly exit (interpreter shutdown, CUDA teardown) took 0.8 s on an
        H100 machine against 0.16 s for the kill, twice in every job."""
        if self._closed:
            return
        self._closed = True
        self.thaw()  # a frozen process dies only once it runs again (cgroup v1)
        self.kill()  # and everything it started: the kill of its namespace's init ends them all
        self.proc.close()
        self._release()

    def _release(self) -> None:
        """Close this side's ends of the child's descriptors, and remove its cgroup."""
        with contextlib.suppress(OSError):
            self.stdin.close()
        os.close(self._reply_fd)
        self._marks.close()
        self._log.close()
        if self._namespace is not None:
            self._namespace.kill()  # closes its pidfd (the child is gone by now)
        if self._cgroup is not None:
            self._cgroup.destroy()

    def discard(self) -> None:
        """End the process and remove its folder."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def warm_children(gpu: bool) -> bool:
    """Whether jobs take children started ahead of them (``Spares``): on GPU devices, unless
    KERNEL_ENV_WARM_CHILDREN=0; on the CPU only with KERNEL_ENV_WARM_CHILDREN=1: there a spare
    has nothing to make ahead (no CUDA context), and a fork costs milliseconds."""
    setting = os.environ.get("KERNEL_ENV_WARM_CHILDREN", "")
    return setting == "1" or (gpu and setting != "0")


class Spares:
    """Evaluation children started ahead of their jobs, ``depth`` per (role, environment).

    A spare is a ``Child.spawn`` like any other: its own sandbox, its own empty directories, its
    own key, and it serves exactly one job (a CUDA fault or anything a candidate left behind ends
    with it). What it has done ahead of time, before any job's file exists, is, on a GPU, to
    make its CUDA context and load the harness's Triton kernels (``timing.preload``), so a job
    that takes it waits for none of that. Taking a spare starts a successor at once, and jobs
    take the oldest, so each spare has two jobs' time to get ready. (Before the fork server, a
    spare was a fresh interpreter that imported torch, Triton and torch._dynamo: about 8 s on an
    H200 machine, and 8-13 s of a core each on a loaded H100 machine.)"""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth
        self._lock = threading.Lock()
        self._waiting: dict[tuple, deque[Future[Child]]] = {}
        self._closed = False
        self._starter = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kernel_env-spare")
        atexit.register(self.close)

    @staticmethod
    def _key(role: str, env: dict[str, str], gpu: bool) -> tuple:
        return role, tuple(sorted(env.items())), gpu

    def take(self, role: str, *, env: dict[str, str], gpu: bool, label: str) -> Child:
        """The oldest spare for this role and environment if one is alive, else a child started
        now; either way successors start importing for the jobs to come."""
        with self._lock:
            queue = self._waiting.get(self._key(role, env, gpu))
            waiting = queue.popleft() if queue else None
        self.prepare(role, env=env, gpu=gpu)
        if waiting is not None:
            try:
                child = waiting.result()
            except Exception:  # noqa: BLE001 - it could not start; start one the plain way
                child = None
            if child is not None and child.proc.poll() is None:
                return child
            if child is not None:
                child.discard()
        return Child.spawn(role, env=env, gpu=gpu, label=label)

    def prepare(self, role: str, *, env: dict[str, str], gpu: bool) -> None:
        """Start spares for this role and environment in the background until ``depth`` wait."""
        with self._lock:
            queue = self._waiting.setdefault(self._key(role, env, gpu), deque())
            while not self._closed and len(queue) < self.depth:
                queue.append(self._starter.submit(Child.spawn, role, env=env, gpu=gpu, label="spare", preload=True))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Freeze the spares started so far while the block runs: a timing run meets no work of
        theirs on the processor (on an H100 machine, eight spares importing torch at once put one
        job's Triton launches past the launch cover, and its time up 3.5x; with the fork server a
        spare's start is a CUDA context, still worth keeping out of a timing run)."""
        with self._lock:
            started = [f.result() for q in self._waiting.values() for f in q if f.done() and f.exception() is None]
        frozen = [child for child in started if child.freeze()]
        try:
            yield
        finally:
            for child in frozen:
                child.thaw()

    def close(self) -> None:
        with self._lock:
            self._closed, waiting, self._waiting = True, [f for q in self._waiting.values() for f in q], {}
        for future in waiting:
            try:
                future.result(timeout=60).discard()
            except Exception:  # noqa: BLE001 - nothing to end
                pass
