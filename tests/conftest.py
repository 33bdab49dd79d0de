"""Shared fixtures: tiny real tasks, real workspaces, real sandboxes of every backend.

Nothing here is mocked. Sandbox fixtures run each test once per backend (``local``: bubblewrap;
``docker``: a container of the local Docker engine, on the host-toolchain image kernel_env
builds itself, so no registry is needed). Workspaces live under pytest's tmp_path;
``KERNEL_ENV_HOME`` points into a per-session temporary folder so no test writes to the user's
~/.cache.

Where this host cannot give the sandbox something a test needs (bubblewrap, a cgroup, a Docker
engine), the test is skipped with a reason that names exactly what is not enforced here;
pytest's ``-ra`` (set in pyproject.toml) lists those reasons at the end of every run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernel_env.sandbox import BACKENDS
from kernel_env.tasks import Task
from support import TINY_TASK, bubblewrap_skip_reason, docker_skip_reason


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_env_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every workspace a test (or the CLI under test) creates by default goes to a throw-away home."""
    home = tmp_path_factory.mktemp("kernel_env_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_ENV_HOME", str(home))
        # Precompiling torch's headers takes half a minute and 500 MB per language: only the tests
        # of that feature (test_headers.py) turn it on.
        patch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "0")
        yield home


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
def docker_engine() -> None:
    """Skips the test, with the reason, only where no Docker engine answers; with
    KERNEL_ENV_REQUIRE_DOCKER=1 (.ci/run sets it) that is a failure instead."""
    reason = docker_skip_reason()
    if reason:
        if os.environ.get("KERNEL_ENV_REQUIRE_DOCKER") == "1":
            pytest.fail(f"KERNEL_ENV_REQUIRE_DOCKER=1 but the docker backend cannot run: {reason}")
        pytest.skip(reason)


@pytest.fixture(params=[pytest.param(b, marks=pytest.mark.slow) if b == "docker" else b for b in BACKENDS])
def backend(request: pytest.FixtureRequest) -> str:
    """Each sandbox backend in turn (docker only where an engine answers: see ``docker_engine``; its
    runs are ``slow``: ``make test-fast`` tries the local backend only)."""
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    return request.param


@pytest.fixture
def make_sandbox(make_workspace, backend: str) -> Iterator[Callable[..., object]]:
    """``make_sandbox(language="cpp", limits=None, workspace=None, **options)`` → a started, isolating
    sandbox of the backend under test, closed afterwards.

    Skips the local backend (with the reason) where bubblewrap cannot isolate on this host: these
    tests are about isolation, and the unisolated fallback has its own test.
    """
    reason = bubblewrap_skip_reason() if backend == "local" else None
    if reason:
        pytest.skip(reason)
    from kernel_env.sandbox import make_sandbox as make_backend

    started = []

    def make(language: str = "cpp", limits=None, workspace=None, **options):
        if backend == "local":
            options.setdefault("require_isolation", True)
        sandbox = make_backend(backend, workspace or make_workspace(language), limits=limits, **options)
        started.append(sandbox)
        sandbox.start()
        return sandbox

    yield make
    for sandbox in started:
        sandbox.close()


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox()
