"""Bubblewrap command lines shared by the agent sandbox and the evaluation workers.

Both get the same read-only view of the toolchain: /usr (and its merged-/usr symlinks),
/opt, the Python installation, a few /etc files, a synthetic passwd/group; nothing else of
the host (no /home, /root, /etc secrets, other workspaces, the kernel_env cache). The docker
backend's default image shows the same view (``toolchain_tops``, ``etc_files``,
``python_prefixes``, ``identity_files``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernel_env.sandbox.base import readable

log = logging.getLogger(__name__)

SANDBOX_UID = 1000
# /etc files the toolchain needs; the rest of /etc (keys, shadow, credentials) stays out.
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf", "mime.types", "ssl/openssl.cnf")


@functools.cache
def bubblewrap_problem() -> str | None:
    """None if bubblewrap works here, else why not (checked once per process)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`"
    probe = subprocess.run(
        [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here ({probe.stderr.strip() or probe.returncode}); enable unprivileged user namespaces or run as root"
    return None


def identity_files(state_dir: Path, uid: int = SANDBOX_UID, gid: int = SANDBOX_UID) -> None:
    """Write the sandbox's own passwd and group into ``state_dir``.

    The state directory is writable from inside the sandbox, so the agent may have replaced
    these files with symlinks to host files: each is written as a fresh file and renamed over
    whatever is there, which never follows a link. Raises OSError if that fails (a directory
    planted under the name, say).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    write_new_file(state_dir / "passwd", f"agent:x:{uid}:{gid}:agent:/tmp/home:/bin/bash\nroot:x:0:0::/root:/usr/sbin/nologin\n")
    write_new_file(state_dir / "group", f"agent:x:{gid}:\nroot:x:0:\n")


def write_new_file(path: Path, text: str) -> None:
    """Replace ``path`` by a new regular file holding ``text`` (mode 0644); never follows a link at ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def toolchain_tops() -> list[tuple[str, str | None]]:
    """The host's top-level toolchain directories, in order: (path, symlink target), the target
    None for a real directory.

    /usr, /bin, /lib*, /sbin, /opt; on a merged-/usr host /bin, /lib… are symlinks into /usr,
    and a sandbox recreates them as the same symlinks.
    """
    tops: list[tuple[str, str | None]] = []
    for top in ("usr", "bin", "lib", "lib64", "lib32", "sbin", "opt"):
        src = Path("/") / top
        if src.is_symlink():
            tops.append((str(src), os.readlink(src)))
        elif src.is_dir():
            tops.append((str(src), None))
    return tops


def etc_files() -> list[str]:
    """The host's /etc files a sandbox may see (those of ``_ETC_FILES`` that exist here)."""
    return [f"/etc/{name}" for name in _ETC_FILES if (Path("/etc") / name).exists()]


def python_executable() -> str:
    """The running interpreter as a sandbox can reach it: its directory resolved (no ``..``, no
    linked directory), its own name kept (a venv's ``python`` link must stay in the venv's bin).

    A sandbox binds the interpreter's prefixes (``python_prefixes``), not the directories a start
    like ``../.venv/bin/python`` from a subfolder went through, where ``sys.executable`` is
    ``/path/subfolder/../.venv/bin/python``."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def python_prefixes() -> list[str]:
    """The running interpreter's installation (venv and base Python) where /usr and /opt do not hold it."""
    return [prefix for prefix in sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
            if prefix != "/usr" and not prefix.startswith(("/usr/", "/opt/"))]


def base_argv(state_dir: Path, *, network: bool = False, new_session: bool = True, extra_ro_binds: tuple[str, ...] = (),
              host_proc: bool = False, die_with_parent: bool = True) -> list[str]:
    """bwrap options for an unprivileged, offline view of the toolchain; callers add their own binds.

    ``host_proc``: the host's /proc rather than one of the sandbox's pid namespace, for a
    sandbox whose processes mount their own in namespaces they create (evaluators/child/zygote.py);
    never for one that runs untrusted code."""
    argv = [shutil.which("bwrap") or "bwrap"]
    if die_with_parent:
        argv.append("--die-with-parent")
    if new_session:
        argv.append("--new-session")
    argv += [
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "kernel-env", "--cap-drop", "ALL",
    ]
    if not network:
        argv.append("--unshare-net")
    for path, target in toolchain_tops():
        argv += ["--symlink", target, path] if target else ["--ro-bind", path, path]
    for path in etc_files():
        argv += ["--ro-bind", path, path]
    identity_files(state_dir)
    argv += ["--ro-bind", str(state_dir / "passwd"), "/etc/passwd", "--ro-bind", str(state_dir / "group"), "/etc/group"]
    # The private /tmp first: binds below may live under /tmp (a venv in a checkout under /tmp, as
    # in CI), and a tmpfs mounted after them would hide them.
    argv += ["--bind", "/proc", "/proc"] if host_proc else ["--proc", "/proc"]
    argv += ["--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home"]
    for prefix in python_prefixes():
        argv += ["--ro-bind", prefix, prefix]
    for extra in extra_ro_binds:
        argv += ["--ro-bind", extra, extra]
    return argv


def gpu_device_binds() -> list[str]:
    """--dev-bind options for the NVIDIA device nodes (empty where there are none)."""
    argv = []
    for node in sorted(Path("/dev").glob("nvidia*")):
        if node.is_char_device():
            argv += ["--dev-bind", str(node), str(node)]
    if argv and Path("/sys").is_dir():
        argv += ["--ro-bind", "/sys", "/sys"]
    return argv


def spawn(argv: list[str], **popen_options) -> tuple[subprocess.Popen, PidNamespace | None]:
    """Start a bwrap command line; returns the process and its pid namespace (None if bwrap
    never reported one, e.g. it failed to start)."""
    read_fd, write_fd = os.pipe()
    pass_fds = (*popen_options.pop("pass_fds", ()), write_fd)
    try:
        proc = subprocess.Popen([argv[0], "--info-fd", str(write_fd), *argv[1:]], pass_fds=pass_fds, **popen_options)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return proc, PidNamespace.from_info_fd(read_fd)


#: Whether this kernel lists each thread's children in /proc (CONFIG_PROC_CHILDREN): see ``PidNamespace.members``.
_CHILDREN_LISTS = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


class PidNamespace:
    """The pid namespace of a running bubblewrap sandbox, held through its init process.

    bwrap's outer process exits as soon as the sandboxed command does, *before* the
    namespace's init has finished killing the rest, so waiting for it proves nothing. The
    init is held by a pidfd (immune to pid reuse): killing it makes the kernel kill every
    process in the namespace, and the pidfd turns readable only once the init has exited,
    which the kernel allows only after all of them are gone.
    """

    def __init__(self, pidfd: int, pid: int | None = None):
        self._pidfd: int | None = pidfd
        self.pid = pid  # the init's pid in the host's namespace
        self._stopped: dict[int, int] = {}  # pid -> pidfd of each process ``stop`` stopped, until ``cont``

    @classmethod
    def from_info_fd(cls, fd: int, timeout: float = 30.0) -> PidNamespace | None:
        """Read bwrap's ``--info-fd`` report (closing ``fd``); None if it never came."""
        data, deadline = b"", time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not readable(fd, remaining):
                    break
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        try:
            pid = int(json.loads(data)["child-pid"])
            return cls(os.pidfd_open(pid), pid)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("bwrap's --info-fd report gave no pid namespace (%s: %s; read %r)", type(exc).__name__, exc,
                        data[:200])
            return None

    def signal(self, signum: int) -> int:
        """Send ``signum`` to every process in the namespace (``members``; twice round, for a process
        started meanwhile); how many were sent it."""
        sent: set[int] = set()
        for _ in range(2):
            for pid in self.members():
                if pid not in sent:
                    with contextlib.suppress(OSError):  # gone meanwhile
                        os.kill(pid, signum)
                        sent.add(pid)
        return len(sent)

    def stop(self, timeout: float = 1.0, wait: bool = True) -> int:
        """SIGSTOP every process in the namespace and wait (up to ``timeout`` seconds, unless not
        ``wait``: see ``stopped``) until each is stopped: the signal takes effect only once a
        process next runs, a moment later on a busy host. How many were sent it. Each is held by a
        pidfd until ``cont``, which continues exactly those (a stopped process starts no other)."""
        self.cont()
        for _ in range(2):  # twice round, for a process started meanwhile
            for pid in self.members():
                if pid in self._stopped:
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except OSError:  # gone meanwhile
                    continue
                try:
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
                except OSError:
                    os.close(fd)
                    continue
                self._stopped[pid] = fd
        deadline = time.monotonic() + timeout
        while wait and self._stopped and not self.stopped() and time.monotonic() < deadline:
            time.sleep(0.001)
        return len(self._stopped)

    def stopped(self) -> bool:
        """Whether every process ``stop`` stopped is stopped now (or gone)."""
        for pid in self._stopped:
            with contextlib.suppress(OSError, IndexError):
                if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "TtZX":
                    return False
        return True

    def cont(self) -> None:
        """SIGCONT every process the last ``stop`` stopped (through its pidfd: never another
        process that took a pid meanwhile)."""
        stopped, self._stopped = self._stopped, {}
        for fd in stopped.values():
            with contextlib.suppress(OSError):  # gone meanwhile
                signal.pidfd_send_signal(fd, signal.SIGCONT)
            os.close(fd)

    def members(self) -> list[int]:
        """The processes of the namespace (host pids): its init and every process descending from it.

        Every process of a pid namespace descends from its init (an orphan is re-parented to it),
        a nested namespace's too, so the tree from the init, read from /proc's ``children`` lists,
        is all of them: a few reads, where matching every process of the host by its namespace
        took two scans of /proc (milliseconds on a host running hundreds of sandboxes, for each
        child that a timing run freezes and thaws). Without those lists (a kernel built without
        CONFIG_PROC_CHILDREN) every process of the host is matched by its namespace."""
        if self._pidfd is None or self.pid is None:
            return []
        try:
            signal.pidfd_send_signal(self._pidfd, 0)  # the init is alive, so its pid is still its own
        except OSError:
            return []
        if not _CHILDREN_LISTS:
            return self._members_by_namespace()
        members, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            members.append(pid)
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except OSError:  # gone meanwhile
                continue
            for tid in threads:
                try:
                    todo += [int(child) for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
                except OSError:
                    continue
        return members

    def _members_by_namespace(self) -> list[int]:
        try:
            namespace = os.readlink(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return []
        members = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    members.append(int(entry))
            except OSError:  # gone, or not ours to look at
                continue
        return members

    def kill(self, timeout: float = 10.0) -> bool:
        """Kill everything in the namespace and wait until it is empty; idempotent. False if it
        did not empty within ``timeout`` seconds."""
        if self._pidfd is None:
            return True
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:  # already exited
            pass
        emptied = readable(self._pidfd, timeout)
        os.close(self._pidfd)
        self._pidfd = None
        self.cont()  # (closes the pidfds of those it had stopped)
        return emptied
