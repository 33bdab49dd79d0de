"""Sandboxes: where an agent's commands and file operations run (see base.py for the contract)."""

from kernel_env.sandbox.base import BackgroundJob, ExecResult, FileInfo, Sandbox, SandboxError

__all__ = ["BackgroundJob", "ExecResult", "FileInfo", "Sandbox", "SandboxError", "make_sandbox"]


def make_sandbox(kind: str, workspace, **options) -> Sandbox:
    """A sandbox of the named backend on a workspace (not started)."""
    if kind == "local":
        from kernel_env.sandbox.local import LocalSandbox

        return LocalSandbox(workspace, **options)
    raise SandboxError(f"unknown sandbox backend {kind!r}; available: local")
