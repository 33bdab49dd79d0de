"""Evaluation child processes, forked by a fork server (``forkserver.py``), and talking to them.

A ``Child`` (a ``judge`` or a ``worker``, ``child/runner.py``) sees the toolchain read-only,
``child/`` read-only, exactly the job directories it needs (read-only or writable), the GPU device
nodes, a private /tmp, its own pid, network, IPC and user namespaces with no capability, and the
sandbox's resource limits. ``Spares`` are children started ahead of jobs.

The harness sends commands (``protocol.COMMANDS``) as JSON lines to the child's stdin and reads
its answers (``protocol.Reply``) from a private pipe, each signed with a key the harness sends
first, before the child imports anything under test: the worker's descriptors are open to the
candidate's code, its key is kept by the runner's channel. The child's stdout and stderr (the
candidate's prints) go to a pipe the harness drains while a command runs, keeping the last
``_LOG_TAIL`` bytes for error messages: a child that prints more than ``_LOG_CAP`` bytes in all is
ended (a flood of output, written to a file, was disk-bound work that slowed every job beside it,
and filled the disk up to the file-size limit). Each child also has a parent socket, on which the
harness hands the judge and the worker of a job the two ends of their own socket (``connect``).

Why one module: a child's process, its descriptors, its cgroup or namespace (``freeze``) and a
judge's calls lock (``pause_calls``) are one object's state, which a timing run of another job
acts on (``sharing.py``); ``Spares`` are those same objects, started early.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hmac
import os
import resource
import secrets
import selectors
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO

from kernel_env.evaluators.child import protocol
from kernel_env.evaluators.child.protocol import Message, ProtocolError, Reply
from kernel_env.evaluators.forkserver import (
    ROLE_DIRS,
    ChildError,
    Zygote,
    child_env,
    zygote_for,
)
from kernel_env.evaluators.sharing import freeze_all
from kernel_env.sandbox.bwrap import PidNamespace, python_executable
from kernel_env.sandbox.limits import Cgroup, Limits

#: A command still running after this long yields the processor to shorter work: its process's
#: threads run at ``_SLOW_NICE`` until it answers (a candidate spinning in ``forward`` on a 2-core
#: machine took the control beside it from 0.9 s to 1.3 s without it). Only where the niceness can
#: be set back (root, or RLIMIT_NICE allows it): the timing run that may follow must not run yielded.
_SLOW_AFTER_S = 2.0
_SLOW_NICE = 10
_PRIORITY_RESTORABLE = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
#: A child's prints: at most this much in all (then it is ended), the last ``_LOG_TAIL`` bytes kept.
_LOG_CAP = 16 << 20
_LOG_TAIL = 64 << 10
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: How often a command's writable directories are measured against the child's ``quota``.
_QUOTA_EVERY_S = 1.0


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def _host_memory_share(fraction: float) -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * fraction)


class CommandFailed(Exception):
    """The child ran the command and reports that it failed (its own words, and the exception's type)."""

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class Child:
    """One isolated evaluation process, forked by ``zygote`` into ``folder`` (a folder of its ``jobs``).

    ``dirs``: the job directories it sees (target -> writable), each the folder's subfolder of
    the target's name; ``preload``: make its CUDA context before any job (a spare)."""

    def __init__(self, role: str, zygote: Zygote, folder: Path, *, dirs: dict[str, bool], env: dict[str, str],
                 shared: dict[str, Path] | None = None, limits: Limits | None = None, preload: bool = False):
        self.role = role
        self.folder = folder
        self.host_paths = {target: folder / PurePosixPath(target).name for target in dirs} | dict(shared or {})
        self.zygote = zygote
        self.isolated = zygote.isolated
        self.paths = {target: target if self.isolated else str(source) for target, source in self.host_paths.items()}
        self._closed = False
        self._calls_lock = self._calls_gate = -1  # a judge's (see pause_calls), opened once it runs
        self._calls_guard = threading.Lock()  # the lease's thread pauses while the job's may close
        # A command in flight (sent, its answer not yet read), or the start; see freeze() and ``held``.
        self._commands = threading.Condition()
        self._busy = True  # until its first answer: a spare makes its CUDA context before it reads its stdin
        #: Frozen by a hold (``freeze``): an idle judge, to which no command is sent until ``thaw``.
        self.held = False
        self._frozen_since: float | None = None  # see freeze(): a step's deadline does not count time frozen
        self._stopped = None  # after freeze(wait=False): whether the child has stopped (``wait_frozen``)
        self._frozen_s = 0.0
        self._nice: int | None = None  # the niceness to go back to while a slow command yields (_SLOW_AFTER_S)
        # CUDA maps a huge address space, so the per-process cap is off; the cgroup bounds real
        # memory to most of this machine's, so a runaway candidate cannot take the host down.
        self.limits = limits or Limits(memory_bytes=_host_memory_share(0.75), address_space_bytes=1 << 46, processes=4096)
        self._cgroup = Cgroup.create(self.limits)
        self._log, log_write = os.pipe()
        os.set_blocking(self._log, False)
        with contextlib.suppress(OSError):  # room for a burst of prints while no command runs
            fcntl.fcntl(self._log, _F_SETPIPE_SZ, 1 << 20)
        self._tail = bytearray()
        self._log_open = True  # until every writer has closed it (the child may close its stdout and stderr)
        self.printed = 0  # bytes the child has written to its stdout and stderr so far
        #: (bytes, files) the child's writable job directories may hold, checked while a command runs
        #: (the host's disk is shared by every job; each file is also capped by ``limits.file_size_bytes``).
        self.quota: tuple[int, int] | None = None
        self._writable = [self.host_paths[target] for target, writable in dirs.items() if writable]
        self._buffer = b""
        stdin_read, stdin_write = os.pipe()
        self._reply_fd, reply_write = os.pipe()
        self._parent, child_parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.stdin: IO[bytes] = os.fdopen(stdin_write, "wb")
        request = {"role": role, "binds": [(target, f"{folder.name}/{PurePosixPath(target).name}", writable)
                                           for target, writable in dirs.items()],
                   "env": {**child_env(python_executable()), **env}, "rlimits": self.limits.rlimits(),
                   "cwd": "/tmp" if self.isolated else str(folder), "preload": preload}
        self._namespace: PidNamespace | None = None
        try:
            self.proc = zygote.fork(request, (stdin_read, log_write, reply_write, child_parent.fileno()),
                                    place=self._cgroup.add if self._cgroup is not None else lambda pid: None)
        except BaseException:
            self._release()
            raise
        finally:
            os.close(stdin_read)
            os.close(log_write)
            os.close(reply_write)
            child_parent.close()
        if self.isolated:
            self._namespace = self.proc.pid_namespace()
        self._key = secrets.token_bytes(32)
        self._write("start", self._key.hex())
        # A judge holds this file's lock through each call with its worker, and passes the gate before it
        # (judge.py); ``pause_calls`` takes both.
        if role == "judge" and "/job/ref" in self.host_paths:
            self._calls_lock, self._calls_gate = (
                os.open(self.host_paths["/job/ref"] / name, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
                for name in (protocol.CALLS_LOCK, protocol.CALLS_GATE))

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

    def call(self, command: Message, answer: type[Message] | None, timeout: float, *, yields: bool = True):
        """Send ``command`` and return the child's answer, decoded as ``answer`` (a dict where None).
        CommandFailed where the child reports an error; ChildError where it died, hung, broke the
        protocol or overran ``timeout`` (see ``receive``)."""
        self.send(command)
        return self.receive(command, answer, timeout, yields=yields)

    def send(self, command: Message) -> None:
        """Send ``command`` (its answer: ``receive``); while the child is held (``freeze``), once it is thawed."""
        with self._commands:
            self._commands.wait_for(lambda: not self.held)
            self._busy = True
        self._write(type(command).__name__, command.encode().decode())

    def receive(self, command: Message, answer: type[Message] | None, timeout: float, *, yields: bool = True,
                beside: Sequence[Child] = ()):
        """The answer to ``command`` (sent earlier). ``timeout``: seconds it may take, not counting
        time the child spent frozen. ``yields``: whether the child yields the processor once the
        command has run ``_SLOW_AFTER_S`` (never for a timing run). ``beside``: children working
        with this one meanwhile (a job's judge and worker), whose prints are drained too."""
        name = type(command).__name__
        line = self._read_line(name, timeout, yields, beside)
        with self._commands:  # it answered: waiting on its stdin again (a child that did not may run on)
            self._busy = False
        raw, _, mac = line.rpartition(b"\t")
        text = raw.decode("utf-8", "replace")
        if not hmac.compare_digest(mac, protocol.sign(self._key, text).encode()):  # bytes: any bytes compare
            raise ChildError(f"the {self.role} process sent an answer to {name} that the harness did not write "
                             "(something in it wrote to the harness's channel)")
        try:
            reply = protocol.decode(text, Reply)
            if not reply.ok:
                raise CommandFailed(reply.error or "no reason given", reply.kind)
            return reply.body if answer is None else protocol.decode(reply.body, answer)
        except ProtocolError as exc:
            raise ChildError(f"the {self.role} process broke the protocol during {name} ({exc})") from None

    def connect(self, other: Child) -> None:
        """Give this child and ``other`` the two ends of a socket of their own (the judge and the worker of a job)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            for child, end in ((self, ours), (other, theirs)):
                try:
                    socket.send_fds(child._parent, [b"peer"], [end.fileno()])
                except OSError:
                    raise ChildError(child._death_note(f"the {child.role} process died before it was connected")) from None
        finally:
            ours.close()
            theirs.close()

    def _write(self, cmd: str, text: str) -> None:
        try:
            self.stdin.write((text + "\n").encode())
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChildError(self._death_note(f"the {self.role} process died during {cmd}")) from None

    def _read_line(self, cmd: str, timeout: float, yields: bool, beside: Sequence[Child]) -> bytes:
        began, frozen_before = time.monotonic(), self.frozen_s()
        measured = began
        try:
            while b"\n" not in self._buffer:
                now = time.monotonic()
                ran = now - began - (self.frozen_s() - frozen_before)  # time spent frozen does not count
                if now - measured >= _QUOTA_EVERY_S:
                    measured = now
                    for child in (self, *beside):
                        over = child._over_quota() if child.quota is not None else ""
                        if over:
                            child.kill()
                            raise ChildError(f"the {child.role} process {over} during {cmd} and was ended")
                if yields and ran >= _SLOW_AFTER_S:
                    self._yield_processor(True)
                remaining = timeout - ran
                if remaining <= 0:
                    self.kill()
                    raise ChildError(f"{cmd} took longer than {timeout:.0f}s and was killed (a hang, a deadlock or an endless loop?)")
                with selectors.DefaultSelector() as sel:
                    sel.register(self._reply_fd, selectors.EVENT_READ)
                    logs = {c._log: c for c in (self, *beside) if c._log_open and c._log >= 0}
                    for fd in logs:
                        sel.register(fd, selectors.EVENT_READ)
                    ready = {key.fileobj for key, _ in sel.select(min(remaining, 1.0))}
                for fd in ready & set(logs):
                    child = logs[fd]
                    if not child._drain_log():
                        child.kill()
                        raise ChildError(f"the {child.role} process printed more than {_LOG_CAP >> 20} MiB during {cmd} and "
                                         "was ended (a flood of output)")
                if self._reply_fd not in ready:
                    if not ready and self.proc.poll() is not None:
                        raise ChildError(self._death_note(f"the {self.role} process died during {cmd}"))
                    continue
                chunk = os.read(self._reply_fd, 1 << 20)
                if not chunk:
                    self.proc.wait()
                    raise ChildError(self._death_note(f"the {self.role} process died during {cmd}"))
                self._buffer += chunk
                if len(self._buffer) > protocol.MAX_MESSAGE + 1024 and b"\n" not in self._buffer:
                    self.kill()
                    raise ChildError(f"the {self.role} process sent an answer to {cmd} longer than the protocol allows")
        finally:
            self._yield_processor(False)
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _yield_processor(self, yielding: bool) -> None:
        """Run the process's threads at ``_SLOW_NICE`` (``yielding``), or at their niceness before.
        Where the kernel groups processes by session for scheduling (autogroup), the niceness of
        threads counts only within their group: the child's group (its session, its own) is
        set too."""
        if yielding == (self._nice is not None) or (yielding and not _PRIORITY_RESTORABLE):
            return
        pid = self.proc.pid
        try:
            if yielding:
                self._nice = os.getpriority(os.PRIO_PROCESS, pid)
            nice = _SLOW_NICE if yielding else self._nice
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as group:
                group.write(str(nice))
        except OSError:
            pass  # the process has ended
        if not yielding:
            self._nice = None

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

    def _over_quota(self) -> str:
        """What the child's writable directories hold beyond its ``quota``, in words; "" within it."""
        most_bytes, most_files = self.quota
        used = files = 0
        stack = list(self._writable)
        while stack:
            with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
                for entry in entries:
                    files += 1
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        used += entry.stat(follow_symlinks=False).st_blocks * 512
            if files > most_files:
                return f"made more than {most_files} files in its job folder"
        return f"wrote {_size(used)} to its job folder (at most {_size(most_bytes)})" if used > most_bytes else ""

    def _drain_log(self) -> bool:
        """Read what the child has printed so far, keeping the last ``_LOG_TAIL`` bytes; False
        once it has printed more than ``_LOG_CAP`` in all."""
        while self.printed <= _LOG_CAP:
            try:
                chunk = os.read(self._log, 1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # closed (the child has been released)
                break
            if not chunk:
                self._log_open = False
                break
            self.printed += len(chunk)
            self._tail += chunk
            del self._tail[:-_LOG_TAIL]
        return self.printed <= _LOG_CAP

    def log_tail(self, limit: int = 2000) -> str:
        """The last ``limit`` bytes the child printed (stdout and stderr), as text."""
        self._drain_log()
        return bytes(self._tail[-limit:]).decode("utf-8", "replace").strip()

    def freeze(self, wait: bool = True) -> bool:
        """Stop every process of the child (see sharing.py): through its cgroup where this host lets
        one be frozen, else with SIGSTOP to each process of its pid namespace. True once none of
        them runs (an ended child's too); False where it cannot be stopped (no isolation, or it
        did not stop: then it runs on). ``wait=False``: only ask, True where asked; ``wait_frozen``
        then waits (so a timing run asks every child at once, and waits once).

        A judge with no command in flight is held instead (``held``: ``send`` waits until ``thaw``),
        at no cost: it runs only the harness's code, which between commands waits on its stdin with
        the device synchronised (``runner.settle``). Not before its first answer: a spare makes its
        CUDA context before it reads a command."""
        self._stopped = None
        if self._closed or self.proc.poll() is not None:
            return True
        if self.role == "judge":
            with self._commands:
                if not self._busy:
                    self.held = True
                    return True
        if self._cgroup is not None and self._cgroup.freeze(wait=False):
            self._stopped = self._cgroup.frozen
        elif self._namespace is not None and self._namespace.stop(wait=False) > 0:
            self._stopped = self._namespace.stopped
        else:
            return False
        self._frozen_since = time.monotonic()
        return self.wait_frozen() if wait else True

    def wait_frozen(self, timeout: float = 2.0) -> bool:
        """After ``freeze(wait=False)``: True once none of the child's processes runs; False (and
        thawed) where they did not stop within ``timeout`` seconds."""
        stopped, self._stopped = self._stopped, None
        deadline = time.monotonic() + timeout
        while stopped is not None and not stopped():
            if time.monotonic() > deadline:
                self.thaw()
                return False
            time.sleep(0.0005)
        return True

    def thaw(self) -> None:
        if self.held:
            with self._commands:
                self.held = False
                self._commands.notify_all()
            return
        if self._cgroup is not None:
            self._cgroup.thaw()
        if self._namespace is not None:
            self._namespace.cont()
        if self._frozen_since is not None:
            self._frozen_s += time.monotonic() - self._frozen_since
            self._frozen_since = None

    def pause_calls(self) -> bool:
        """Keep a judge from starting a call with its worker (see sharing.py); False while one is in
        flight (ask again: none starts meanwhile, ``protocol.CALLS_GATE``). Other roles start no
        calls. ``resume_calls`` undoes it, paused or not."""
        with self._calls_guard:
            if self._calls_lock < 0:
                return True
            try:
                # The judge holds the gate only for a moment, as it starts a call; taking it again once held
                # is a no-op (flock converts a descriptor's own lock).
                fcntl.flock(self._calls_gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(self._calls_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    def resume_calls(self) -> None:
        with self._calls_guard:
            if self._calls_lock >= 0:
                fcntl.flock(self._calls_lock, fcntl.LOCK_UN)
                fcntl.flock(self._calls_gate, fcntl.LOCK_UN)

    def frozen_s(self) -> float:
        """Seconds this child has spent frozen so far: a step's deadline does not count them."""
        since = self._frozen_since
        return self._frozen_s + (time.monotonic() - since if since is not None else 0.0)

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
        self._parent.close()
        self._drain_log()  # for a death note still to be written
        os.close(self._log)
        self._log = -1
        with self._calls_guard:
            if self._calls_lock >= 0:
                os.close(self._calls_lock)
                os.close(self._calls_gate)
                self._calls_lock = self._calls_gate = -1
        if self._namespace is not None:
            self._namespace.kill()  # closes its pidfd (the child is gone by now)
        if self._cgroup is not None:
            self._cgroup.destroy()

    def discard(self) -> None:
        """End the process and remove its folder."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Spares:
    """Evaluation children started ahead of their jobs, ``depth`` per (role, environment).

    A spare is a ``Child.spawn`` like any other: its own sandbox, its own empty directories, its
    own key, and it serves exactly one job (a CUDA fault or anything a candidate left behind ends
    with it). What it has done ahead of time, before any job's file exists, is, on a GPU, to
    make its CUDA context (``runner.preload``), so a job
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
        job's Triton launches late and its time up 3.5x; with the fork server a
        spare's start is a CUDA context, still worth keeping out of a timing run)."""
        with self._lock:
            started = [f.result() for q in self._waiting.values() for f in q if f.done() and f.exception() is None]
        frozen = freeze_all(started)
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
