"""Sandboxes: where an agent's commands and file operations run (see base.py for the contract)."""

from kernel_env.sandbox.base import BackgroundJob, ExecResult, FileInfo, Sandbox, SandboxError

__all__ = ["BACKENDS", "BackgroundJob", "ExecResult", "FileInfo", "Sandbox", "SandboxError", "make_sandbox"]

#: The sandbox backends: ``local`` (bubblewrap, local.py) and ``docker`` (docker.py).
BACKENDS = ("local", "docker")


def make_sandbox(kind: str, workspace, **options) -> Sandbox:
    """A sandbox of the named backend on a workspace (not started). Raises SandboxError for an
    unknown backend, and (docker) when no Docker engine answers."""
    if kind == "local":
        from kernel_env.sandbox.local import LocalSandbox

        return LocalSandbox(workspace, **options)
    if kind == "docker":
        from kernel_env.sandbox.docker import DockerSandbox

        return DockerSandbox(workspace, **options)
    raise SandboxError(f"unknown sandbox backend {kind!r}; available: {', '.join(BACKENDS)}")
