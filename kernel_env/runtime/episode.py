"""One task in one workspace: workspace + sandbox + broker + pool, wired together.

An episode's flow (docs/design.md, Environments) without the RL interface: ``run-task``, the
environments and the OpenHands plug-in all build on it, so the agent's tools, its
compile/verify/profile commands and the final trusted evaluation are the same everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode
from kernel_env.evaluators.verdict import failed
from kernel_env.languages import Language, get_language
from kernel_env.runtime.broker import Broker
from kernel_env.runtime.pool import GpuPool, default_pool, visible_gpus
from kernel_env.sandbox import ExecResult, Sandbox, make_sandbox
from kernel_env.tasks import Task
from kernel_env.workspace import Checks, Workspace

log = logging.getLogger(__name__)

COMPILE_COMMAND = "bash utils/compile.sh"
#: Which solution of an episode counts: the one in the workspace at the end, or the best one the
#: trusted harness saw during the episode (the CUDA Agent paper's choice).
Selection = Literal["final", "best"]
_MAX_KEPT_SOURCE_BYTES = 8 << 20


class EpisodeError(RuntimeError):
    """A configuration that cannot work here (the message says why and what to do)."""


def default_device() -> str:
    """Where code runs when no device is named: cuda when this process sees a GPU, else cpu."""
    return "cuda" if visible_gpus() else "cpu"


def language_and_device(language: str | None = None, device: str | None = None) -> tuple[str, str]:
    """(language, device) of a run: what is named, the rest following the machine. This is the one
    rule every entry point uses (``kernel_env.make``, ``Episode.open``, the workloads, the CLI):
    the device is ``default_device()`` (cuda on a GPU machine, else cpu) and the language the one
    that device runs natively (cuda on a GPU, cpp on the CPU). Naming either one changes only
    what it names: ``language="triton"`` alone still runs on the machine's device."""
    device = device or default_device()
    return language or ("cuda" if device == "cuda" else "cpp"), device


def check_device(language: Language, device: str) -> None:
    if device not in ("cuda", "cpu"):
        raise EpisodeError(f"unknown device {device!r}; choose cuda or cpu")
    if language.needs_cuda and device != "cuda":
        raise EpisodeError(f"{language.name} kernels need a CUDA GPU; use --language cpp or triton to work on the CPU")
    if device == "cuda" and not visible_gpus():
        raise EpisodeError("no CUDA GPU is visible on this machine; use --device cpu with --language cpp or triton")


@functools.cache
def allow_many_open_files() -> None:
    """Raise this process's soft limit on open files to its hard limit, once: an open episode
    holds several descriptors here (its sandbox's pipes and pidfd, the broker's socket), and a
    driver with hundreds of episodes passes the usual soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def score(result: EvalResult) -> tuple[float, float, float]:
    """How good a result is: reward, then speed-up vs torch.compile, then vs eager (higher is better)."""
    return (result.reward if result.reward is not None else -1.0, result.speedup_vs_compile or 0.0,
            result.speedup_vs_eager or 0.0)


@dataclass
class _Evaluated:
    """A solution the trusted harness evaluated: its result and its sources, as they were."""

    result: EvalResult
    sources: dict[str, bytes]
    digest: str


@dataclass
class Episode:
    """One task's workspace, its sandbox and its broker, opened with ``Episode.open``; every
    trusted evaluation of the episode lands in ``results``, and ``final_evaluation`` gives the
    episode's trusted result."""

    task: Task
    language: Language
    device: str
    workspace: Workspace
    sandbox: Sandbox
    broker: Broker
    #: Every trusted evaluation of this episode, in the order they finished (the agent's
    #: verification and profiling runs, and final evaluations).
    results: list[EvalResult] = field(default_factory=list)
    #: Seconds spent in ``compile`` (the final evaluations' clean rebuilds); the evaluations' are the broker's.
    build_s: float = 0.0
    _best: _Evaluated | None = None
    _digests: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, task: Task, *, language: str | None = None, device: str | None = None, sandbox: str = DEFAULT_SANDBOX,
             pool: GpuPool | None = None, root: str | Path | None = None, settings: EvalSettings | None = None,
             sandbox_options: dict | None = None) -> Episode:
        """Set up the task's workspace, sandbox and broker, and start the sandbox.

        Args:
            task: the task.
            language: cuda | cpp | triton; None: the one the device runs natively
                (``language_and_device``: cuda on a GPU, cpp on the CPU).
            device: where the trusted harness runs, cuda | cpu; None: cuda where a GPU is visible.
            sandbox: the sandbox backend, "local" (bubblewrap) or "docker".
            pool: where evaluations run; None: this process's shared local pool.
            root: the folder the workspace is made in; None: ``$KERNEL_ENV_HOME/workspaces``.
            settings: EvalSettings for every evaluation; the workspace's SKILL.md and
                ``utils/verification.py`` state its trials, tolerance and margin. None: the protocol's.
            sandbox_options: keyword arguments for the backend's constructor.

        Returns:
            The open episode; ``close()`` (or leaving a ``with`` block) ends it and removes the
            workspace.

        Raises:
            ValueError: an unknown language.
            EpisodeError: a language and device that cannot run here (the message says what to use).
            SandboxError: the sandbox cannot be made or started; the broker and the workspace are
                removed."""
        language, device = language_and_device(language, device)
        lang = get_language(language)
        check_device(lang, device)
        allow_many_open_files()
        checks = settings or EvalSettings()
        workspace = Workspace.create(task, lang, root=root, checks=Checks(checks.trials, checks.atol, checks.rtol, checks.speedup_margin))
        broker = Broker(pool or default_pool(), device=device, settings=settings)
        try:
            broker_dir = broker.serve(workspace)
            box = make_sandbox(sandbox, workspace, broker_dir=broker_dir, **(sandbox_options or {}))
            box.start()
        except BaseException:
            broker.close()
            workspace.destroy()
            raise
        episode = cls(task, lang, device, workspace, box, broker)
        broker.on_result = episode._record
        return episode

    def _record(self, result: EvalResult, snapshot: Path) -> None:
        """Keep every result, and the sources of the best one (for selection="best")."""
        sources = _read_sources(snapshot)
        digest = _digest(sources) if sources is not None else ""
        with self._lock:
            self.results.append(result)
            self._digests[result.job_id] = digest
            if sources is not None and (self._best is None or score(result) > score(self._best.result)):
                self._best = _Evaluated(result, sources, digest)

    def compile(self, timeout: float | None = None, *, clean: bool = False) -> ExecResult:
        """Run the workspace's build as the agent would, within ``timeout`` (default: the settings'
        ``build_timeout_s``); ``clean`` first removes build/ (so nothing the agent left there, a
        planted object file say, can end up in the module)."""
        command = f"rm -rf build && {COMPILE_COMMAND}" if clean else COMPILE_COMMAND
        started = time.monotonic()
        try:
            return self.sandbox.exec(command, timeout=timeout or self.broker.settings.build_timeout_s, max_output=20_000)
        finally:
            self.build_s += time.monotonic() - started

    def evaluate(self, mode: Mode = Mode.FINAL) -> EvalResult:
        return self.broker.evaluate_workspace(self.workspace, mode)

    def build_and_evaluate(self, mode: Mode = Mode.FINAL, *, clean: bool = False) -> tuple[ExecResult, EvalResult]:
        """Build, then evaluate: (build, result). A failed build is a result too (not compiled, reward -1)."""
        build = self.compile(clean=clean)
        if build.ok:
            return build, self.evaluate(mode)
        why = f"took longer than {self.broker.settings.build_timeout_s:.0f}s and was ended" if build.timed_out \
            else f"exit code {build.exit_code}"
        return build, failed(job_id="build", task_id=self.task.id, language=self.language.name, device=self.device, mode=mode,
                             compiled=False, fault="candidate", margin=self.broker.settings.speedup_margin,
                             error=f"`{COMPILE_COMMAND}` failed ({why}):\n{build.output[-4000:]}")

    def final_evaluation(self, selection: Selection = "best") -> EvalResult:
        """The episode's trusted result: everything the agent started is killed (the sandbox is
        restarted), the solution is rebuilt from scratch and evaluated (Mode.FINAL).

        ``selection="best"``: if an earlier evaluation of *other* sources scored higher than the
        final workspace, those sources are restored, rebuilt and evaluated too, and the better of
        the two final evaluations counts (the workspace is left holding that solution)."""
        with self._lock:
            best = self._best
        self.sandbox.close()
        self.sandbox.start()
        final = self._final_evaluation()
        if selection == "best" and best is not None and best.digest != self._digests.get(final.job_id) \
                and score(best.result) > score(final):
            final_sources = _read_workspace_sources(self.sandbox)
            self._restore(best.sources)
            again = self._final_evaluation()
            if score(again) > score(final):
                return again
            self._restore(final_sources)
        return final

    def _final_evaluation(self) -> EvalResult:
        """A clean rebuild evaluated in Mode.FINAL; the same build evaluated once more if the
        evaluator failed (a worker lost, a child that could not start): an evaluator's fault says
        nothing of the solution, and nothing of the agent's runs since the restart to touch the build."""
        _, result = self.build_and_evaluate(Mode.FINAL, clean=True)
        if result.fault == "evaluator":
            log.warning("final evaluation of %s failed by the evaluator's fault (%s); evaluating it again",
                        self.task.id, result.error)
            result = self.evaluate(Mode.FINAL)
        return result

    def _restore(self, sources: dict[str, bytes]) -> None:
        """Make the agent's files exactly ``sources`` (through the sandbox, so links stay inside it)."""
        self.sandbox.exec("rm -rf kernels model_new.py build && mkdir kernels", timeout=60)
        for path, data in sources.items():
            self.sandbox.write_bytes(path, data)

    def close(self, *, keep_workspace: bool = False) -> None:
        self.sandbox.close()
        self.broker.close()
        if not keep_workspace:
            self.workspace.destroy()

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_solution(task: Task, solution: str | Path, *, language: str | None = None, device: str | None = None,
                 sandbox: str = DEFAULT_SANDBOX, pool: GpuPool | None = None, settings: EvalSettings | None = None,
                 mode: Mode = Mode.FINAL) -> tuple[ExecResult, EvalResult]:
    """Copy a solution into a fresh workspace, build it in the sandbox, and evaluate it, the way
    ``kernel-env run-task --solution`` does. Its phases are logged (INFO,
    ``kernel_env.runtime.episode``): the first evaluation of a task on a machine measures its
    baselines, minutes on a CPU.

    Args:
        task: the task.
        solution: a folder holding ``model_new.py`` and, if any, ``kernels/``.
        language, device, sandbox, pool, settings: as ``Episode.open``'s.
        mode: the evaluation's mode (default ``Mode.FINAL``, the trusted final evaluation).

    Returns:
        build (ExecResult): the build's exit code and output.
        result (EvalResult): the evaluation; a failed build is a result too (not compiled, reward -1).

    Raises:
        FileNotFoundError: the solution folder has no ``model_new.py``.
        ValueError, EpisodeError, SandboxError: as ``Episode.open``."""
    started = time.monotonic()
    log.info("%s: setting up its workspace and sandbox (%s)", task.id, sandbox)
    with Episode.open(task, language=language, device=device, sandbox=sandbox, pool=pool, settings=settings) as episode:
        episode.workspace.copy_solution(solution)
        log.info("%s: building the %s solution, then its trusted evaluation (%s) on the %s", task.id,
                 episode.language.name, mode.value, episode.device)
        build, result = episode.build_and_evaluate(mode)
    log.info("%s: done in %.1f s: %s, reward %s", task.id, time.monotonic() - started,
             "correct" if result.correct else "not correct", result.reward)
    return build, result


def _read_sources(snapshot: Path) -> dict[str, bytes] | None:
    """model_new.py and kernels/** of a broker snapshot (plain files the broker copied); None when
    there are none or they are too large to keep."""
    files = [f for f in [snapshot / "model_new.py", *sorted((snapshot / "kernels").rglob("*"))] if f.is_file() and not f.is_symlink()]
    if not files or sum(f.stat().st_size for f in files) > _MAX_KEPT_SOURCE_BYTES:
        return None
    return {str(f.relative_to(snapshot)): f.read_bytes() for f in files}


def _read_workspace_sources(sandbox: Sandbox) -> dict[str, bytes]:
    files = [sandbox.stat("model_new.py"), *sandbox.glob("kernels/**")]
    workdir = sandbox.workdir.rstrip("/") + "/"
    return {info.path.removeprefix(workdir): sandbox.read_bytes(info.path) for info in files if info and not info.is_dir}


def _digest(sources: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(sources):
        digest.update(path.encode() + b"\0" + sources[path] + b"\0")
    return digest.hexdigest()[:16]
