"""The Sandbox contract: where an agent's commands and file operations run.

Every backend (``local`` bubblewrap, ``docker``) runs the same small server inside the
isolation boundary (``kernel_env/sandbox/server.py``) and talks to it over its stdin and
stdout, so commands *and* file operations happen with the sandbox's own privileges and
view of the file system: a symlink the agent plants can never make the host read or write
outside the workspace. Backends differ only in how they start and stop that server
(``client.py`` holds the protocol they share).
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kernel_env.workspace import Workspace


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds. poll, not select: a driver with
    hundreds of episodes open holds file descriptors past select's limit of 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked; the message is written for the agent."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one shell command.

    ``output`` is stdout and stderr interleaved as the command wrote them; when the command
    wrote more than the cap, its head and tail are kept around a marker and ``truncated`` is
    set. ``exit_code`` is None when the command was killed (timeout, or the sandbox died).
    """

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    output_bytes: int = 0
    duration_s: float = 0.0
    note: str = ""  # e.g. "the sandbox was restarted"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class BackgroundJob:
    """A background command's state and the output it wrote since the previous look."""

    job_id: str
    command: str
    running: bool
    exit_code: int | None
    new_output: str
    truncated: bool = False


@dataclass(frozen=True)
class FileInfo:
    path: str  # as seen inside the sandbox
    is_dir: bool
    size: int
    mtime: float


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run an agent's work on one workspace.

    Paths given to the file methods are sandbox paths: absolute inside the sandbox, or
    relative to ``workdir``. They must resolve (symlinks followed, inside the sandbox) to
    somewhere under ``workdir``; anything else raises SandboxError. Writes to protected
    files raise SandboxError. No method raises anything but SandboxError for bad input.
    """

    workspace: Workspace
    #: The workspace's path as the agent sees it (``/workspace`` for the isolating backends).
    workdir: str

    def start(self) -> None:
        """Start the sandbox; idempotent. Raises SandboxError if it cannot be started."""

    def exec(self, command: str, timeout: float = 180.0, *, max_output: int = 30_000) -> ExecResult:
        """Run one command in the persistent shell session.

        The working directory, exported and plain variables, functions and aliases carry over to
        the next call. A command still running after ``timeout`` seconds is killed with its
        process group and reported as timed out; the session stays usable. If the sandbox died
        (the agent killed it), it is restarted with the shell state of the last finished command.
        """

    def start_background(self, command: str) -> str:
        """Start a command in the background; returns a job id for background_output/kill_background."""

    def background_output(self, job_id: str, *, max_output: int = 30_000) -> BackgroundJob:
        """Output written since the last call, and whether the job still runs. Unknown ids raise SandboxError."""

    def kill_background(self, job_id: str) -> BackgroundJob:
        """Kill a background job and its process group."""

    def read_bytes(self, path: str, *, limit: int = 10_000_000) -> bytes:
        """A file's contents (at most ``limit`` bytes; larger files raise SandboxError)."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Create or replace a file atomically, making parent directories as needed."""

    def stat(self, path: str) -> FileInfo | None:
        """Information on a path inside the workspace, or None if it does not exist."""

    def glob(self, pattern: str, base: str = ".") -> list[FileInfo]:
        """Files under ``base`` matching a glob (``**`` recurses), newest first."""

    def close(self) -> None:
        """Stop everything the sandbox runs; idempotent. Nothing started inside survives it."""
