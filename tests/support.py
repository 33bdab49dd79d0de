"""What the tests share besides fixtures: a tiny real task, and the reasons a host cannot enforce a limit.

(Test modules import from here, not from conftest: tests/gpu has a conftest of its own, and
``import conftest`` would find whichever was loaded first.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from concurrent.futures import Future
from pathlib import Path

from kernel_env.evaluators.records import EvalJob, EvalResult, Mode

TINY_TASK = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, scale: float = 2.0):
            super().__init__()
            self.scale = scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * self.scale


    def get_inputs():
        return [torch.randn(8, 16)]


    def get_init_inputs():
        return [2.0]
    """
)


# ----------------------------------------------------------------------------- what this host enforces


def bubblewrap_skip_reason() -> str | None:
    from kernel_env.sandbox.local import bubblewrap_problem

    problem = bubblewrap_problem()
    return f"NOT ENFORCED ON THIS HOST: the local sandbox cannot isolate: {problem}" if problem else None


def docker_skip_reason() -> str | None:
    from kernel_env.sandbox.docker import docker_problem

    problem = docker_problem()
    return f"NOT ENFORCED ON THIS HOST: the docker sandbox cannot run: {problem}" if problem else None


def _docker_engine_lacks(feature: str) -> str | None:
    """Why the Docker engine cannot enforce a limit (``docker info``'s PidsLimit, MemoryLimit, SwapLimit), or None."""
    from kernel_env.sandbox.docker import engine

    if engine().info().get(feature):
        return None
    return f"NOT ENFORCED ON THIS HOST: the Docker engine reports {feature}=false (its cgroup controller is missing)"


def cgroup_available() -> bool:
    """Whether this process can give a sandbox a cgroup (whole-sandbox process and memory caps)."""
    from kernel_env.sandbox.limits import Cgroup, Limits

    group = Cgroup.create(Limits())
    if group is None:
        return False
    group.destroy()
    return True


def process_limit_skip_reason(backend: str = "local") -> str | None:
    """Why the sandbox's process-count cap does not hold on this host, or None if it does."""
    if backend == "docker":
        return _docker_engine_lacks("PidsLimit")
    if cgroup_available():
        return None
    if os.geteuid() == 0:
        return ("NOT ENFORCED ON THIS HOST: no cgroup can be created (no writable pids controller), and the host "
                "runs as root, so the sandbox's processes are host-root and the kernel ignores RLIMIT_NPROC for them")
    return None  # not root: RLIMIT_NPROC applies to the sandbox's (host) uid


def memory_limit_skip_reason(backend: str = "local") -> str | None:
    if backend == "docker":
        return _docker_engine_lacks("MemoryLimit") or _docker_engine_lacks("SwapLimit")
    if cgroup_available():
        return None
    return ("NOT ENFORCED ON THIS HOST: no cgroup can be created (no writable memory controller), so only the "
            "per-process address-space cap (RLIMIT_AS) bounds memory, not the sandbox as a whole")


# ----------------------------------------------------------------------------- Ray


def snapshot_job(folder: Path, model_new: str, **fields) -> EvalJob:
    """An evaluation job of a fresh snapshot under ``folder`` that holds ``model_new`` (and an empty
    kernels/); ``fields``: the job's others (task_id, task_code, language, device, mode, settings)."""
    snapshot = folder / f"snapshot-{uuid.uuid4().hex[:8]}"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text(model_new)
    return EvalJob(job_id=uuid.uuid4().hex[:12], snapshot_dir=snapshot, **fields)


def ray_busy_worker(pool, avoid: frozenset[int] = frozenset(), timeout: float = 120.0) -> int:
    """The pid of a started actor of a RayPool that runs a job, other than those in ``avoid``,
    waited for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [w["pid"] for w in pool.workers() if w["ready"] and w["running"] and w["pid"] not in avoid]
        if pids:
            return pids[0]
        time.sleep(0.1)
    raise AssertionError(f"no actor of the Ray pool ran a job within {timeout:.0f} s: {pool.workers()}")


def ray_workers_started(pool, count: int, timeout: float = 120.0) -> list[dict]:
    """The RayPool's actors, once ``count`` of them have started (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [w for w in pool.workers() if w["ready"]]
        if len(started) >= count:
            return started
        time.sleep(0.2)
    raise AssertionError(f"{count} actors of the Ray pool were not started within {timeout:.0f} s: {pool.workers()}")


# ----------------------------------------------------------------------------- pools


class FinalEvaluatorFault:
    """The shared pool, but every final evaluation fails by the evaluator's fault (a worker lost)."""

    def __init__(self):
        from kernel_env.runtime.pool import default_pool

        self.inner, self.finals = default_pool(), 0

    def submit(self, job):
        if job.mode is not Mode.FINAL:
            return self.inner.submit(job)
        self.finals += 1
        answer = Future()
        answer.set_result(EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                                     mode=job.mode, error="the Ray worker running this job died twice", fault="evaluator"))
        return answer

    def close(self):
        pass


# ----------------------------------------------------------------------------- docs' blocks, run as written
# (test_docs_examples.py, test_trainers_doc.py)

ROOT = Path(__file__).resolve().parents[1]


def scratch_checkout(folder: Path, skip: tuple[str, ...] = ()) -> Path:
    """A scratch checkout: every top-level entry of this one but ``.git`` and ``skip``, linked (and .venv,
    where the venv lives elsewhere), so what a block writes lands in ``folder``."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", *skip):
            (folder / entry.name).symlink_to(entry)
    if not (folder / ".venv").exists():
        (folder / ".venv").symlink_to(sys.prefix)
    return folder


def active_venv(home: Path | None = None) -> dict[str, str]:
    """The environment with this venv active (its bin/ first on PATH); HOME at ``home`` where given."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": sys.prefix}
    if home is not None:
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
    return env


def shell_commands(code: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [re.split(r"\s+#", line)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def assert_serves_and_drains(server: str, folder: Path, env: dict[str, str], log: Path, label: str) -> None:
    """``server`` (a ``kernel-env serve`` command) started in ``folder`` on a free port (the page's may be
    taken on this host: the last --port wins, and it says which) answers /health, and drains to exit 0
    on SIGTERM."""
    with log.open("w") as err:
        process = subprocess.Popen(["bash", "-c", f"exec {server} --port 0"], cwd=folder, env=env, stdout=subprocess.PIPE,
                                   stderr=err, text=True)
    try:
        line = process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, f"{label}: `{server}` printed {line!r}; its log:\n{log.read_text()[-3000:]}"
        with urllib.request.urlopen(f"{match.group(1)}/health", timeout=30) as answer:
            assert json.load(answer)["status"] == "healthy"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
