"""The ``docker`` sandbox: the same in-sandbox server, in a container of the local Docker Engine.

What the agent's processes get: a read-only root file system (an image's, or by default a
scratch image with the host's toolchain bound read-only: the local sandbox's view), a private
tmpfs /tmp, the workspace writable at /workspace with its protected files bound read-only on
top, the broker's socket folder read-only, no network (``network_mode="none"``), uid 1000 (the
host user's uid when the host is not root), no capabilities, ``no-new-privileges``, and
cgroup caps on processes, memory (swap included) and CPU, plus the local sandbox's rlimits.

The server talks over the container's attach stream (stdin raw, stdout and stderr in the
Engine's multiplexed frames). Lifetime: ``close()`` removes the container (a forced remove
kills it first, so every process in it is gone when it returns). If this process dies, the
attach stream closes, the server reads the end of its stdin and exits, and the container
removes itself (``auto_remove``); ``reap()``, run whenever a DockerSandbox is made, removes any
container left whose owner process is gone (containers are labelled with their owner).

This module needs an Engine on this machine: workspaces and the toolchain are bind mounts of
host paths. It never pulls an image: building them is ``kernel-env image build``.

Why one module of ~500 lines: the container's whole security posture (mounts, user, caps,
cgroups, lifetime, reaping) must be read together to be audited.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import shutil
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path

from kernel_env.headers import SANDBOX_HEADERS, host_folder
from kernel_env.sandbox.base import SandboxError, readable
from kernel_env.sandbox.bwrap import (
    SANDBOX_UID, etc_files, identity_files, python_executable, python_prefixes, toolchain_tops, write_new_file,
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
    ServerSandbox,
    sandbox_environment,
)
from kernel_env.sandbox.limits import Limits
from kernel_env.workspace import PROTECTED, Workspace

log = logging.getLogger(__name__)

LABEL = "kernel_env.sandbox"
OWNER_LABEL = "kernel_env.owner"  # "<boot id>/<pid namespace>/<pid>/<process start time>"
WORKSPACE_LABEL = "kernel_env.workspace"
TASK_LABEL = "kernel_env.task"
IMAGE_LABEL = "kernel_env.image"
HOST_TOOLCHAIN_REPOSITORY = "kernel_env/host-toolchain"
#: Where the images of sandbox_images/ keep the Python that runs the server and the agent's code.
IMAGE_PYTHON = "/opt/venv/bin/python"
DEFAULT_CPUS = 4.0
_SEND_TIMEOUT_S = 120.0
_STDERR_KEPT = 8192


# ----------------------------------------------------------------------------- the engine


@functools.cache
def _client():
    import docker

    return docker.from_env(timeout=120)


def _engine_errors() -> tuple[type[Exception], ...]:
    """What the SDK raises when the engine refuses or cannot be reached (requests' errors are not wrapped)."""
    import docker
    import requests

    return docker.errors.DockerException, requests.exceptions.RequestException


def engine():
    """The Docker client of this process (shared). Raises SandboxError when no engine answers."""
    try:
        import docker  # noqa: F401 (the SDK's absence is a clear error, not an ImportError deep inside)
    except ImportError:
        raise SandboxError("the docker sandbox needs the Docker SDK for Python: pip install docker") from None
    try:
        client = _client()
        client.ping()
    except _engine_errors() as exc:
        _client.cache_clear()
        raise SandboxError(f"no Docker engine answers here ({exc}); start dockerd, or use sandbox='local'") from None
    return client


def docker_problem() -> str | None:
    """None if a Docker engine answers here, else why not."""
    try:
        engine()
    except SandboxError as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------- the host-toolchain image

_image_lock = threading.Lock()
_host_image: str | None = None


def _rootfs_tar() -> bytes:
    """A root file system of only the mount points a sandbox needs, and the host's merged-/usr
    symlinks (/bin -> usr/bin…). Deterministic: the same host layout gives the same bytes."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path, target in toolchain_tops():
            if target is None:
                continue
            entry = tarfile.TarInfo(path.lstrip("/"))
            entry.type, entry.linkname = tarfile.SYMTYPE, target
            tar.addfile(entry)
        for name, mode in (("tmp", 0o1777), ("etc", 0o755), ("workspace", 0o755), ("run", 0o755), ("run/kernel_env", 0o755)):
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, mode
            tar.addfile(entry)
    return data.getvalue()


def host_toolchain_image(client=None) -> str:
    """The tag of the default sandbox image, built here if missing, in well under a second.

    It is a scratch image with nothing in it: the host's toolchain (/usr, /opt, the Python
    installation, a few /etc files; the same view as the local sandbox's) is bound read-only
    when a container starts. So the docker backend works on any machine with an Engine, with no
    registry and no build. Raises SandboxError if the Engine refuses the import.
    """
    global _host_image
    import docker

    client = client or engine()
    data = _rootfs_tar()
    tag = f"{HOST_TOOLCHAIN_REPOSITORY}:{hashlib.sha256(data).hexdigest()[:16]}"
    with _image_lock:
        if _host_image == tag:
            return tag
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            repository, version = tag.split(":")
            try:
                client.api.import_image_from_data(data, repository=repository, tag=version,
                                                  changes=[f"LABEL {IMAGE_LABEL}=host-toolchain"])
                client.images.get(tag)
            except _engine_errors() as exc:
                raise SandboxError(f"cannot create the sandbox image {tag}: {exc}") from None
        except _engine_errors() as exc:
            raise SandboxError(f"cannot look up the sandbox image {tag}: {exc}") from None
        _host_image = tag
        return tag


def _forget_host_image() -> None:
    global _host_image
    with _image_lock:
        _host_image = None


# ----------------------------------------------------------------------------- owners and the reaper


def _process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@functools.cache
def _machine() -> str:
    """This boot of this machine, and this pid namespace: where an owner pid means something."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    namespace = os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    return f"{boot}/{namespace}"


def _owner() -> str:
    return f"{_machine()}/{os.getpid()}/{_process_start(os.getpid())}"


def _owner_gone(owner: str) -> bool:
    """True only for an owner of this machine and pid namespace that no longer runs; an owner
    elsewhere (another pid namespace sharing the Engine) cannot be judged, so it is kept."""
    parts = owner.split("/")
    if len(parts) != 4 or "/".join(parts[:2]) != _machine() or not parts[2].isdigit():
        return False
    return _process_start(int(parts[2])) != parts[3]


def reap(client=None) -> list[str]:
    """Remove every kernel_env sandbox container whose owner process is gone; returns their ids.

    Containers normally go with ``close()``, or by themselves when their owner dies (the attach
    stream closes, the server exits, the container is auto-removed); this catches the rest.
    Raises SandboxError when no Engine answers.
    """
    client = client or engine()
    try:
        containers = client.api.containers(all=True, filters={"label": LABEL})
    except _engine_errors() as exc:
        raise SandboxError(f"cannot list the sandbox containers: {exc}") from None
    removed = []
    for container in containers:
        if _owner_gone((container.get("Labels") or {}).get(OWNER_LABEL, "")):
            try:
                _remove(client, container["Id"])
            except (*_engine_errors(), SandboxError) as exc:
                log.warning("could not remove the orphaned sandbox container %s: %s", container["Id"][:12], exc)
                continue
            removed.append(container["Id"])
    if removed:
        log.info("removed %d sandbox container(s) whose owner had died", len(removed))
    return removed


def _remove(client, container_id: str, timeout: float = 30.0) -> None:
    """Kill and remove a container and wait until it is gone (it may already be going: auto-remove)."""
    import docker

    try:
        client.api.remove_container(container_id, force=True)
        return
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: its removal is already under way
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        time.sleep(0.05)
    raise SandboxError(f"container {container_id[:12]} was still there {timeout:.0f} s after its removal began")


# ----------------------------------------------------------------------------- the attach stream


class AttachChannel:
    """A container's server on the Engine's attach stream: stdin raw; stdout and stderr in
    frames of an 8-byte header (stream number, 3 zero bytes, big-endian size) and the payload."""

    def __init__(self, stream):
        self._stream = stream  # keeps the HTTP response (and so the connection) alive
        self._sock: socket.socket = stream if isinstance(stream, socket.socket) else stream._sock
        self._sock.settimeout(_SEND_TIMEOUT_S)
        self._frames = bytearray()
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._eof = False

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            end = self._stdout.find(b"\n")
            if end >= 0:
                line = bytes(self._stdout[:end])
                del self._stdout[: end + 1]
                return line
            if self._eof:
                raise EOFError
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not readable(self._sock.fileno(), remaining):
                raise TimeoutError
            self._pump()

    def alive(self) -> bool:
        while not self._eof and readable(self._sock.fileno(), 0):
            self._pump()
        return not self._eof

    def errors(self) -> str:
        return self._stderr.decode("utf-8", "replace")

    def close(self) -> None:
        for step in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close, self._stream.close):
            try:
                step()
            except OSError:
                pass

    def _pump(self) -> None:
        """Read what the socket has (it is readable) and sort complete frames by stream."""
        try:
            chunk = self._sock.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self._eof = True
            return
        frames = self._frames
        frames += chunk
        while len(frames) >= 8:
            size = int.from_bytes(frames[4:8], "big")
            if len(frames) < 8 + size:
                break
            target = self._stdout if frames[0] == 1 else self._stderr if frames[0] == 2 else None
            if target is not None:
                target += frames[8: 8 + size]
            del frames[: 8 + size]
        if len(self._stderr) > _STDERR_KEPT:
            del self._stderr[: len(self._stderr) - _STDERR_KEPT]


# ----------------------------------------------------------------------------- the sandbox


class DockerSandbox(ServerSandbox):
    """A container sandbox on one workspace. See ``kernel_env.sandbox.base.Sandbox`` for the contract.

    ``image=None`` uses the host-toolchain image (see ``host_toolchain_image``) and this
    interpreter; a named image (one of sandbox_images/, built with ``kernel-env image build``)
    brings its own toolchain, and its Python at ``python`` (default ``IMAGE_PYTHON``).
    ``cpus`` caps the CPU time of the whole container (clamped to this machine's count);
    ``runtime`` picks an OCI runtime the Engine knows (``"runsc"``: gVisor, its own kernel).
    Raises SandboxError when no Engine answers.
    """

    def __init__(self, workspace: Workspace, *, image: str | None = None, python: str | None = None,
                 limits: Limits | None = None, cpus: float = DEFAULT_CPUS, network: bool = False,
                 extra_ro_binds: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 broker_dir: Path | None = None, runtime: str | None = None):
        super().__init__(workspace, SANDBOX_WORKDIR)
        self.isolated = True
        self.image = image
        self.python = python or (python_executable() if image is None else IMAGE_PYTHON)
        self.limits = limits or Limits()
        self.cpus = max(0.01, min(cpus, float(os.cpu_count() or 1)))
        self.network = network
        self.extra_ro_binds = extra_ro_binds
        self.extra_env = env or {}
        self.broker_dir = broker_dir
        self.runtime = runtime
        # As root, the agent is uid 1000 and gets its files handed over; otherwise it is this user.
        self.uid, self.gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
        #: The running container's id (None when stopped).
        self.container_id: str | None = None
        self._channel_of_container: AttachChannel | None = None
        self._client = engine()
        reap(self._client)

    # ----------------------------------------------------------------- lifecycle

    def _launch(self) -> AttachChannel:
        import docker

        self._prepare_host_side()
        for attempt in range(2):
            image = self.image or host_toolchain_image(self._client)
            try:
                self.container_id = self._create(image)
                break
            except docker.errors.ImageNotFound:
                if self.image is not None:
                    raise SandboxError(f"docker image {image!r} is not on this machine; build it with "
                                       f"`kernel-env image build` (see sandbox_images/README.md)") from None
                _forget_host_image()  # removed behind our back (docker image prune): make it again
                if attempt:
                    raise SandboxError(f"the sandbox image {image} vanished while it was being used") from None
            except _engine_errors() as exc:
                raise SandboxError(f"cannot create the sandbox container: {exc}") from None
        try:
            stream = self._client.api.attach_socket(self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._channel_of_container = AttachChannel(stream)
            self._client.api.start(self.container_id)
        except _engine_errors() as exc:
            raise SandboxError(f"cannot start the sandbox container: {exc}") from None
        return self._channel_of_container

    def _stop(self) -> None:
        channel, self._channel_of_container = self._channel_of_container, None
        if channel is not None:
            channel.close()
        container_id, self.container_id = self.container_id, None
        if container_id is not None:
            try:
                _remove(self._client, container_id)
            except Exception as exc:  # noqa: BLE001 (close() must not raise; the reaper retries)
                log.warning("sandbox for %s: could not remove container %s: %s", self.workspace.task.id, container_id[:12], exc)

    def _prepare_host_side(self) -> None:
        """What must hold on the host before a container starts: the agent's files belong to its
        uid (when we are root), the broker's folder admits that uid, and the sandbox's /etc files
        are fresh (the state folder is the agent's: whatever it left there is replaced, not followed)."""
        ws = self.workspace
        ws.state_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            ws.hand_over(self.uid, self.gid)
            if self.broker_dir is not None:
                os.chown(self.broker_dir, 0, self.gid)
                os.chmod(self.broker_dir, 0o750)
        identity_files(ws.state_dir, self.uid, self.gid)
        write_new_file(ws.state_dir / "resolv.conf", "")  # else the Engine copies in the host's

    # ----------------------------------------------------------------- the container

    def _create(self, image: str) -> str:
        import docker
        from docker.types import Mount, Ulimit

        api = self._client.api
        host_config = api.create_host_config(
            mounts=[Mount(target, source, type="bind", read_only=read_only) for target, source, read_only in self._mounts()],
            tmpfs={"/tmp": "rw,exec,nosuid,nodev,mode=1777"},
            read_only=True,
            network_mode="bridge" if self.network else "none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=self.limits.processes,
            mem_limit=self.limits.memory_bytes,
            memswap_limit=self.limits.memory_bytes,  # no swap on top
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[Ulimit(name=name, soft=value, hard=value) for name, value in (
                ("as", self.limits.address_space_bytes), ("fsize", self.limits.file_size_bytes),
                ("nofile", self.limits.open_files), ("core", 0))],
            ipc_mode="private",
            auto_remove=True,
            runtime=self.runtime,
        )
        created = api.create_container(
            image, command=[self.python, "-I", "-B", SANDBOX_SERVER], user=f"{self.uid}:{self.gid}",
            stdin_open=True, environment=self._environment(), working_dir=SANDBOX_WORKDIR, hostname="kernel-env",
            labels=self._labels(), host_config=host_config, use_config_proxy=False,
        )
        if not isinstance(created, dict) or "Id" not in created:
            raise docker.errors.DockerException(f"unexpected answer to create: {created!r}")
        return created["Id"]

    def _mounts(self) -> list[tuple[str, str, bool]]:
        """(target, host source, read-only) for every bind; the Engine mounts outer paths first."""
        ws = self.workspace
        state = ws.state_dir
        mounts: list[tuple[str, str, bool]] = []
        if self.image is None:  # the host's toolchain, as the local sandbox shows it
            dirs = [path for path, target in toolchain_tops() if target is None]
            mounts += [(path, path, True) for path in [*dirs, *etc_files(), *python_prefixes()]]
            mounts += [("/etc/passwd", str(state / "passwd"), True), ("/etc/group", str(state / "group"), True)]
        mounts += [
            ("/etc/resolv.conf", str(state / "resolv.conf"), True),
            (SANDBOX_STATE, str(state), False),
            (SANDBOX_SERVER, str(SERVER), True),
            (SANDBOX_BIN, str(SHIMS), True),
            (SANDBOX_WORKDIR, str(ws.path), False),
        ]
        if self.broker_dir is not None:
            mounts.append((SANDBOX_BROKER, str(self.broker_dir), True))
        if (headers := host_folder()) is not None:  # made with the host's toolchain: an image's own finds no key there
            mounts.append((SANDBOX_HEADERS, str(headers), True))
        mounts += [(f"{SANDBOX_WORKDIR}/{name}", str(ws.path / name), True) for name in PROTECTED if (ws.path / name).exists()]
        mounts += [(path, path, True) for path in self.extra_ro_binds]
        return mounts

    def _environment(self) -> dict[str, str]:
        return sandbox_environment(
            python_bin=os.path.dirname(self.python), shims=SANDBOX_BIN, home=SANDBOX_HOME, workdir=SANDBOX_WORKDIR,
            state=SANDBOX_STATE, broker_socket=f"{SANDBOX_BROKER}/broker.sock" if self.broker_dir is not None else None,
            headers=SANDBOX_HEADERS if host_folder() is not None else None,
            toolchain_variables=self.image is None, extra=self.extra_env,
        )

    def _labels(self) -> dict[str, str]:
        return {LABEL: "1", OWNER_LABEL: _owner(), WORKSPACE_LABEL: str(self.workspace.path), TASK_LABEL: self.workspace.task.id}

    # ----------------------------------------------------------------- a person's shell

    def interactive_argv(self) -> list[str]:
        """Command line for a person's interactive shell in this sandbox's container (``docker
        exec``: the same mounts, limits and user; a terminal of the container's own when stdin is
        one, so nothing run there can type into the person's terminal). Starts the sandbox if
        needed. Raises SandboxError without the docker command-line client."""
        cli = shutil.which("docker")
        if cli is None:
            raise SandboxError("a shell in a docker sandbox needs the docker command-line client (apt-get install docker.io)")
        self.start()
        terminal = ["-t"] if sys.stdin.isatty() else []
        return [cli, "exec", "-i", *terminal, "-u", f"{self.uid}:{self.gid}", "-w", SANDBOX_WORKDIR,
                "-e", f"TERM={os.environ.get('TERM') or 'xterm'}", "-e", r"PS1=[kernel-env \W]\$ ",
                self.container_id, "bash", "--noprofile", "--norc", "-i"]
