"""One task in one workspace: workspace + sandbox + broker + pool, wired together.

This is the flow of DESIGN.md's episode without the RL interface: ``run-task``, the
environments and the OpenHands plug-in all build on it, so the agent's tools, its
compile/verify/profile commands and the final trusted evaluation are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernel_env.broker import Broker
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode
from kernel_env.languages import Language, get_language
from kernel_env.pool import GpuPool, default_pool, visible_gpus
from kernel_env.sandbox import ExecResult, Sandbox, make_sandbox
from kernel_env.tasks import Task
from kernel_env.workspace import Workspace

COMPILE_COMMAND = "bash utils/compile.sh"


class EpisodeError(RuntimeError):
    """A configuration that cannot work here (the message says why and what to do)."""


def default_device() -> str:
    return "cuda" if visible_gpus() else "cpu"


def check_device(language: Language, device: str) -> None:
    if device not in ("cuda", "cpu"):
        raise EpisodeError(f"unknown device {device!r}; choose cuda or cpu")
    if language.needs_cuda and device != "cuda":
        raise EpisodeError(f"{language.name} kernels need a CUDA GPU; use --language cpp or triton to work on the CPU")
    if device == "cuda" and not visible_gpus():
        raise EpisodeError("no CUDA GPU is visible on this machine; use --device cpu with --language cpp or triton")


@dataclass
class Episode:
    task: Task
    language: Language
    device: str
    workspace: Workspace
    sandbox: Sandbox
    broker: Broker

    @classmethod
    def open(cls, task: Task, *, language: str = "cuda", device: str | None = None, sandbox: str = "local",
             pool: GpuPool | None = None, root: str | Path | None = None, settings: EvalSettings | None = None,
             sandbox_options: dict | None = None) -> Episode:
        lang = get_language(language)
        device = device or default_device()
        check_device(lang, device)
        workspace = Workspace.create(task, lang, root=root)
        broker = Broker(pool or default_pool(), device=device, settings=settings)
        try:
            broker_dir = broker.serve(workspace)
            box = make_sandbox(sandbox, workspace, broker_dir=broker_dir, **(sandbox_options or {}))
            box.start()
        except BaseException:
            broker.close()
            workspace.destroy()
            raise
        return cls(task, lang, device, workspace, box, broker)

    def compile(self, timeout: float = 600.0) -> ExecResult:
        """Run the workspace's build as the agent would."""
        return self.sandbox.exec(COMPILE_COMMAND, timeout=timeout, max_output=20_000)

    def evaluate(self, mode: Mode = Mode.FINAL) -> EvalResult:
        return self.broker.evaluate_workspace(self.workspace, mode)

    def close(self, *, keep_workspace: bool = False) -> None:
        self.sandbox.close()
        self.broker.close()
        if not keep_workspace:
            self.workspace.destroy()

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_solution(task: Task, solution: str | Path, *, language: str = "cuda", device: str | None = None,
                 sandbox: str = "local", pool: GpuPool | None = None, settings: EvalSettings | None = None,
                 mode: Mode = Mode.FINAL) -> tuple[ExecResult, EvalResult]:
    """Copy a solution into a fresh workspace, build it in the sandbox, evaluate it: (build, result)."""
    with Episode.open(task, language=language, device=device, sandbox=sandbox, pool=pool, settings=settings) as episode:
        episode.workspace.copy_solution(solution)
        build = episode.compile()
        if not build.ok:
            why = "timed out" if build.timed_out else f"exit code {build.exit_code}"
            result = EvalResult(job_id="build", task_id=task.id, language=episode.language.name, device=episode.device,
                                mode=mode, compiled=False, reward=-1.0,
                                error=f"`{COMPILE_COMMAND}` failed ({why}):\n{build.output[-4000:]}")
            return build, result
        return build, episode.evaluate(mode)
