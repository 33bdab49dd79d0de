"""Bubblewrap command lines shared by the agent sandbox and the evaluation workers.

Both get the same read-only view of the toolchain: /usr (and its merged-/usr symlinks),
/opt, the Python installation, a few /etc files, a synthetic passwd/group; nothing else of
the host (no /home, /root, /etc secrets, other workspaces, the kernel_env cache).
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def identity_files(state_dir: Path) -> None:
    """Write the sandbox's own passwd and group into ``state_dir``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "passwd").write_text(f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:/tmp/home:/bin/bash\nroot:x:0:0::/root:/usr/sbin/nologin\n")
    (state_dir / "group").write_text(f"agent:x:{SANDBOX_UID}:\nroot:x:0:\n")


def base_argv(state_dir: Path, *, network: bool = False, new_session: bool = True, extra_ro_binds: tuple[str, ...] = ()) -> list[str]:
    """bwrap options for an unprivileged, offline view of the toolchain; callers add their own binds."""
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent"]
    if new_session:
        argv.append("--new-session")
    argv += [
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "kernel-env", "--cap-drop", "ALL",
    ]
    if not network:
        argv.append("--unshare-net")
    for top in ("usr", "bin", "lib", "lib64", "lib32", "sbin", "opt"):
        src = Path("/") / top
        if src.is_symlink():
            argv += ["--symlink", os.readlink(src), str(src)]
        elif src.is_dir():
            argv += ["--ro-bind", str(src), str(src)]
    for name in _ETC_FILES:
        if (Path("/etc") / name).exists():
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    identity_files(state_dir)
    argv += ["--ro-bind", str(state_dir / "passwd"), "/etc/passwd", "--ro-bind", str(state_dir / "group"), "/etc/group"]
    # The private /tmp first: binds below may live under /tmp (a venv in a checkout under /tmp, as
    # in CI), and a tmpfs mounted after them would hide them.
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home"]
    for prefix in sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}):
        if prefix != "/usr" and not prefix.startswith(("/usr/", "/opt/")):
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


class PidNamespace:
    """The pid namespace of a running bubblewrap sandbox, held through its init process.

    bwrap's outer process exits as soon as the sandboxed command does, *before* the
    namespace's init has finished killing the rest, so waiting for it proves nothing. The
    init is held by a pidfd (immune to pid reuse): killing it makes the kernel kill every
    process in the namespace, and the pidfd turns readable only once the init has exited,
    which the kernel allows only after all of them are gone.
    """

    def __init__(self, pidfd: int):
        self._pidfd: int | None = pidfd

    @classmethod
    def from_info_fd(cls, fd: int, timeout: float = 30.0) -> PidNamespace | None:
        """Read bwrap's ``--info-fd`` report (closing ``fd``); None if it never came."""
        data, deadline = b"", time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    break
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        try:
            return cls(os.pidfd_open(int(json.loads(data)["child-pid"])))
        except (ValueError, KeyError, TypeError, OSError):
            return None

    def kill(self, timeout: float = 10.0) -> bool:
        """Kill everything in the namespace and wait until it is empty; idempotent. False if it
        did not empty within ``timeout`` seconds."""
        if self._pidfd is None:
            return True
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:  # already exited
            pass
        emptied = bool(select.select([self._pidfd], [], [], timeout)[0])
        os.close(self._pidfd)
        self._pidfd = None
        return emptied
