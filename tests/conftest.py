"""Shared fixtures: tiny real tasks, real workspaces, real bubblewrap sandboxes.

Nothing here is mocked. Workspaces live under pytest's tmp_path; ``KERNEL_ENV_HOME`` points
into a per-session temporary folder so no test writes to the user's ~/.cache.

Where this host cannot give the sandbox something a test needs (bubblewrap, a cgroup), the
test is skipped with a reason that names exactly what is not enforced here; pytest's ``-ra``
(set in pyproject.toml) lists those reasons at the end of every run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernel_env.tasks import Task
from support import TINY_TASK, bubblewrap_skip_reason


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_env_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every workspace a test (or the CLI under test) creates by default goes to a throw-away home."""
    home = tmp_path_factory.mktemp("kernel_env_home")
    old = os.environ.get("KERNEL_ENV_HOME")
    os.environ["KERNEL_ENV_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("KERNEL_ENV_HOME", None)
    else:
        os.environ["KERNEL_ENV_HOME"] = old


@pytest.fixture
def tiny_task() -> Task:
    return Task(id="test/tiny_relu", code=TINY_TASK, source="file", name="tiny_relu")


@pytest.fixture
def make_workspace(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """``make_workspace(language="cpp", task=None)`` → a fresh Workspace under tmp_path, destroyed afterwards."""
    from kernel_env.workspace import Workspace

    created = []

    def make(language: str = "cpp", task: Task | None = None):
        ws = Workspace.create(task or Task(id="test/tiny_relu", code=TINY_TASK, name="tiny_relu"), language, root=tmp_path / "workspaces")
        created.append(ws)
        return ws

    yield make
    for ws in created:
        ws.destroy()


# ----------------------------------------------------------------------------- sandboxes


@pytest.fixture
def make_sandbox(make_workspace) -> Iterator[Callable[..., object]]:
    """``make_sandbox(language="cpp", limits=None)`` → a started, isolating LocalSandbox, closed afterwards.

    Skips (with the reason) where bubblewrap cannot isolate on this host: these tests are about
    isolation, and the unisolated fallback has its own test.
    """
    reason = bubblewrap_skip_reason()
    if reason:
        pytest.skip(reason)
    from kernel_env.sandbox.local import LocalSandbox

    started = []

    def make(language: str = "cpp", limits=None, workspace=None):
        sandbox = LocalSandbox(workspace or make_workspace(language), limits=limits, require_isolation=True)
        sandbox.start()
        started.append(sandbox)
        return sandbox

    yield make
    for sandbox in started:
        sandbox.close()


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox()
