"""The fork server of evaluation children: imports the runner once, forks every child from there.

A fresh interpreter pays seconds of imports (torch, Triton, torch._dynamo: 8-13 s of a core on a
loaded H100 machine) before it can run a job; this process pays them once for every child of one
kind (one environment, GPU or not), and a child then costs a fork, a few mounts and, on a GPU, its
own CUDA context.

- ``serve``: the server (``python -I -B zygote.py``, started by ``forkserver.Zygote``).
- ``CHILD_FDS``: the descriptors a request carries, in order.

It must never initialise CUDA (a process forked after that cannot use the device: it checks, and
refuses to serve) nor run a task's or a candidate's code. A request on the socket ``KE_ZYGOTE_FD``
names is a JSON header and the child's descriptors. Two forks serve it: the warden (``_warden``),
which the host puts into the child's cgroup and which then makes the child's namespaces and mounts,
and the child (``_run_child``), pid 1 of the new pid namespace, which mounts its /proc, drops every
capability and runs ``runner.main``. Without bubblewrap (``KE_ISOLATE`` unset) the same forks
happen with no namespaces. What a child sees, and why the host's /proc: docs/security.md, The
evaluation children; docs/design.md, A job's steps.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import guards  # noqa: E402
import runner  # noqa: E402 - torch, Triton and the harness's modules, imported once for every child

# The process has numpy's BLAS threads, which OpenBLAS stops around a fork itself.
warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
# statvfs's f_flag bits have the values of the MS_ flags they stand for.
_KEPT_FLAGS = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | 0x400 | 0x800 | 0x1000000  # and noatime, nodiratime, relatime
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 24, 38, 47
_NAMESPACES = (os.CLONE_NEWUSER | os.CLONE_NEWNS | os.CLONE_NEWPID | os.CLONE_NEWNET | os.CLONE_NEWIPC
               | os.CLONE_NEWUTS | os.CLONE_NEWCGROUP)
#: The child's descriptors, in the order a request carries them, and the numbers they get in the child.
CHILD_FDS = ("stdin", "log", "reply", "parent", "control")
_REPLY_FD, _PARENT_FD = 3, 4
_COVERED_PROC = ("sys", "sysrq-trigger", "irq", "bus")


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {source or fstype} on {target}")


def _bind(source: str, target: str, *, read_only: bool) -> None:
    _mount(source, target, None, _MS_BIND | _MS_REC)
    if read_only:
        _read_only(target)


def _read_only(target: str) -> None:
    """Remount one mount read-only, keeping the flags a user namespace may not clear (nosuid, nodev, ...)."""
    kept = os.statvfs(target).f_flag & _KEPT_FLAGS
    _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | kept)


def _prctl(option: int, arg: int, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(arg3), 0, 0), f"prctl({option})")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_privileges() -> None:
    """No capability left, none to be had again: the bounding and ambient sets emptied, then the
    process's own sets, then no_new_privs (no setuid or file-capability gain through exec)."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _prctl(_PR_CAPBSET_DROP, cap)
    _prctl(_PR_CAP_AMBIENT, 4)  # PR_CAP_AMBIENT_CLEAR_ALL
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "capset")  # version 3
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _loopback_up() -> None:
    """The new network namespace's loopback, up (as bubblewrap leaves it): nothing else is in it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS: UP, LOOPBACK, RUNNING


def _interpreter_under_tmp() -> list[str]:
    """The interpreter's folders (its prefixes and import path) that lie under /tmp, outermost
    only: a child's private /tmp would hide them, and torch imports some modules only when
    first used (``torch.save`` imports ``torch.utils.serialization``). The host side's view of the
    same folders is ``kernel_env.sandbox.bwrap.python_prefixes``, which this folder cannot import."""
    folders = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p}
    under = sorted(p for p in folders if p.startswith("/tmp/") and os.path.isdir(p))
    return [p for p in under if not any(p.startswith(outer + "/") for outer in under)]


_INTERPRETER_UNDER_TMP = _interpreter_under_tmp()


def _enter_namespaces(req: dict) -> None:
    """The warden's part: namespaces of the child's own, its job directories at /job/..., and
    private /tmp and /dev/shm."""
    uid, gid = os.getuid(), os.getgid()
    os.unshare(_NAMESPACES)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    for shared_by_all in ("/", "/dev"):  # bubblewrap's root and /dev: one tmpfs each for every child
        _read_only(shared_by_all)
    for target, source, writable in req["binds"]:
        _bind(f"/jobs/{source}", target, read_only=not writable)
    _mount("tmpfs", "/jobs", "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=000,size=4k")
    # Handles on the interpreter's folders under /tmp, taken before the private /tmp hides them.
    kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for path in _INTERPRETER_UNDER_TMP]
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for path, handle in kept:
        os.makedirs(path, exist_ok=True)
        _bind(f"/proc/self/fd/{handle}", path, read_only=True)
        os.close(handle)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    os.makedirs("/tmp/home", mode=0o755)
    _loopback_up()


def _enter_child_proc() -> None:
    """The child's part, as pid 1 of its namespace: its own /proc over the host's, the global knobs covered."""
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for name in _COVERED_PROC:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _bind(path, path, read_only=True)


def _child_descriptors(fds: dict[str, int]) -> None:
    """stdin 0, stdout and stderr the log, the reply pipe 3, the parent socket 4; nothing else open."""
    high = {name: fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for name, fd in fds.items()}
    for fd in fds.values():
        os.close(fd)
    for name, target in (("stdin", 0), ("log", 1), ("log", 2), ("reply", _REPLY_FD), ("parent", _PARENT_FD)):
        os.dup2(high[name], target)
    os.closerange(_PARENT_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


#: A worker's namespace init ends with this plus the signal that ended its runner (the warden reads it back).
_SIGNAL_EXIT = 128


def _stay_as_init() -> None:
    """(A worker, pid 1 of its namespace.) Fork the runner, which returns from here as pid 2, and stay
    as the namespace's init: reap every process there until the runner ends, and end as it did.

    Why: CUDA's IPC memory handles carry the exporting process's pid as that process sees it, and a
    process refuses a handle that names its own pid (CUDA_ERROR_INVALID_CONTEXT): the judge is pid 1
    of its namespace, so the worker that shares memory with it must not be."""
    runner_pid = os.fork()
    if runner_pid == 0:
        return
    os.closerange(0, resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the runner's descriptors are the runner's
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == runner_pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else _SIGNAL_EXIT - code)


def _run_child(req: dict, fds: dict[str, int], isolated: bool) -> None:
    """Become the evaluation child and run the runner; never returns."""
    code = 1
    try:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        _child_descriptors(fds)  # first: from here on, what goes wrong is in the child's log
        if isolated:
            _enter_child_proc()
            if req["role"] == "worker":
                _stay_as_init()  # the runner goes on as pid 2
        for name, value in req["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if isolated:
            _drop_privileges()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(req["env"], KE_REPLY_FD=str(_REPLY_FD), KE_PARENT_FD=str(_PARENT_FD))
        os.chdir(req["cwd"])
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        if req.get("preload"):  # a spare: its CUDA context, before any job
            runner.preload(req["role"])
        runner.main(req["role"])
        code = 0
    except BaseException:  # noqa: BLE001 - reported in the child's log, which the harness shows
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _warden(server: socket.socket, req: dict, fds: dict[str, int], isolated: bool) -> None:
    """Serve one request: announce this process on the control socket, wait for "go" (the host has put
    it into the child's cgroup), enter the child's namespaces, fork the child, report it, wait for it
    and report how it ended; never returns."""
    server.close()  # the zygote's socket never reaches a child: with it one could ask for another job's files
    control = socket.socket(fileno=fds.pop("control"))
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        socket.send_fds(control, [b"warden"], [os.pidfd_open(os.getpid())])
        if control.recv(16) != b"go":  # the host has put this process in the child's cgroup, or has given up
            os._exit(1)
        if isolated:
            _enter_namespaces(req)
        pid = os.fork()
        if pid == 0:
            control.close()
            _run_child(req, fds, isolated)
        for fd in fds.values():
            os.close(fd)
        socket.send_fds(control, [b"child"], [os.pidfd_open(pid)])
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if isolated and req["role"] == "worker" and code > _SIGNAL_EXIT:  # its runner's signal, through its init
            code = _SIGNAL_EXIT - code
        control.send(f"exit {code}".encode())
    except BaseException as exc:  # noqa: BLE001 - the host turns it into a ChildError
        try:
            control.send(f"error {type(exc).__name__}: {exc}".encode()[:4000])
        except OSError:
            pass
    os._exit(0)


def _check_isolation() -> None:
    """Fork a process that makes namespaces as a warden does, and raise if it cannot: on such a host
    (unprivileged user namespaces nested in bubblewrap's refused, as Ubuntu's AppArmor setting
    kernel.apparmor_restrict_unprivileged_userns=1 does) no child could be isolated, and no job run."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNS)
            _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV)
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - told to the parent
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[:1000])
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        problem = pipe.read().decode("utf-8", "replace")
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise RuntimeError(f"it cannot make namespaces for a child inside its bubblewrap sandbox ({problem or 'no reason given'}); "
                           "evaluation children need unprivileged user namespaces, nested (on Ubuntu 24.04: sysctl "
                           "kernel.apparmor_restrict_unprivileged_userns=0)")


def _cuda_initialised() -> bool:
    """Whether CUDA's driver has been initialised in this process (asked in a way that does not initialise it)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return cuda.cuDeviceGetCount(ctypes.byref(count)) != 3  # CUDA_ERROR_NOT_INITIALIZED


def _ready_triton_driver() -> None:
    """Triton's CUDA driver object, its C module built and loaded, made without asking torch whether
    CUDA is available (which initialises it), and the key of Triton's own build (a hash of its
    sources and its 500 MB library, which every kernel's first compile asks for: 0.3 s of a core
    in every candidate's process): children find both made."""
    try:
        import triton
        from triton.backends.nvidia.driver import CudaDriver
        from triton.runtime.cache import triton_key
    except ImportError:
        return
    try:
        triton.runtime.driver.set_active(CudaDriver())
        triton_key()  # functools.lru_cache: the children inherit the answer
    except Exception:  # noqa: BLE001 - each child makes its own then, and reports what fails
        pass


def serve() -> None:
    """Serve requests until the host closes its end of the socket (``KE_ZYGOTE_FD``; ``KE_ISOLATE``
    and ``KE_GPU`` say whether to isolate children and ready Triton's CUDA driver). Answers "ready",
    or "error ..." and raises where no child could be served (no namespaces here, CUDA initialised)."""
    server = socket.socket(fileno=int(os.environ.pop("KE_ZYGOTE_FD")))
    isolated = os.environ.pop("KE_ISOLATE", "") == "1"
    gpu = os.environ.pop("KE_GPU", "") == "1"
    try:
        if isolated:
            _check_isolation()
        guards.preload()  # without CUDA_VISIBLE_DEVICES here: torch is never asked about CUDA
        if gpu:
            _ready_triton_driver()
        if _cuda_initialised():
            raise RuntimeError("CUDA was initialised in the fork server; its children could not use the device")
    except BaseException as exc:  # noqa: BLE001 - the host reports it
        server.send(f"error {type(exc).__name__}: {exc}".encode()[:4000])
        raise
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # wardens are reaped by the kernel
    server.send(b"ready")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(server, 1 << 16, len(CHILD_FDS))
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno in (errno.ECONNRESET, errno.EBADF):
                return
            raise
        if not message:
            return  # the host is gone (it closed its end, or died): so are we, and bubblewrap ends the rest
        if len(fds) != len(CHILD_FDS):
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            _warden(server, json.loads(message), dict(zip(CHILD_FDS, fds)), isolated)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    serve()
