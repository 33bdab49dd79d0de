"""kernel_env as an OpenHands plug-in: an OpenHands agent works on a kernel task with kernel_env's
tools in kernel_env's sandbox, and the episode ends with KernelAgent-v0's trusted final evaluation,
so the reward is the same. docs/openhands.md shows its use and says why this design.

- ``run_openhands``: one whole run (agent, conversation, final evaluation) -> ``OpenHandsRun``.
- ``KernelWorkspace``: an OpenHands ``LocalWorkspace`` that *is* one ``Episode``; its commands and
  file transfers run in the episode's sandbox, ``final_evaluation`` is the episode's.
- ``KERNEL_TOOLS``: kernel_env's tools but Finish (``KERNEL_TOOL_NAMES``) as OpenHands tools
  (``KernelTool`` subclasses, registered under their class names: ``Tool(name="KernelBashTool")``).
- ``kernel_agent``: an OpenHands ``Agent`` with those tools and ``kernel_skill``, the language's SKILL.md.

Never run anything the agent asks for on the host. ``kernel_agent`` offers only kernel_env's tools
and OpenHands' built-in finish, think and invoke_skill (which touch nothing but the conversation)
and filters out any other tool; OpenHands' own terminal and file-editor tools run on the host.

Importing this module sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and ``OPENHANDS_SUPPRESS_BANNER=1``
unless they are set (else litellm downloads a price list from GitHub on import). openhands-sdk
configures logging as it is imported (its ``setup_logging``): the root logger to INFO, and every
logger then at the root's old level to INFO with it, torch's among them, so torch's exit-time INFO
reports (TorchDynamo's traced frames and compile times, cache metrics) printed as any process that
imported this module ended (pytest's runs, after their summary). The loggers it lowered that way
get their own level back; the root's and openhands' own are left as it set them.

Why one module of this length: it is one plug-in; importing it registers the tools, each tool binds
to the conversation's KernelWorkspace, and the agent offers exactly these tools.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Self

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

_levels = {name: logger.level for name, logger in logging.root.manager.loggerDict.items()
           if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET}
try:
    from openhands.sdk import LLM, Agent, AgentContext, Conversation
    from openhands.sdk.conversation.exceptions import ConversationRunError
    from openhands.sdk.conversation.state import (
        ConversationExecutionStatus,
        ConversationState,
    )
    from openhands.sdk.conversation.visualizer import DefaultConversationVisualizer
    from openhands.sdk.event import Event, LLMConvertibleEvent
    from openhands.sdk.event.conversation_error import ConversationErrorEvent
    from openhands.sdk.skills import Skill
    from openhands.sdk.tool import (
        Action,
        Observation,
        Tool,
        ToolAnnotations,
        ToolDefinition,
        ToolExecutor,
        register_tool,
    )
    from openhands.sdk.workspace import (
        CommandResult,
        FileOperationResult,
        LocalWorkspace,
    )
except ModuleNotFoundError as exc:  # the extra is not installed
    raise ModuleNotFoundError(f"kernel_env.integrations.openhands needs the OpenHands SDK ({exc}); "
                              "install it with: pip install 'kernel_env[openhands]'", name=exc.name) from exc
for _name, _level in _levels.items():  # those setup_logging lowered with the root (the docstring says why)
    _logger = logging.getLogger(_name)
    if _logger.level != _level and _logger.level == logging.root.level:
        _logger.setLevel(_level)
del _levels

from pydantic import Field, PrivateAttr, create_model

from kernel_env.config import DEFAULT_SANDBOX
from kernel_env.evaluators.records import EvalResult, EvalSettings
from kernel_env.evaluators.report import model_report
from kernel_env.evaluators.reward import RewardKind, paid_reward
from kernel_env.resources import skill_file
from kernel_env.runtime.episode import Episode, Selection
from kernel_env.runtime.pool import GpuPool, shared_pool
from kernel_env.sandbox import SandboxError
from kernel_env.tasks import Task, resolve_task
from kernel_env.tools import DEFAULT_MAX_OUTPUT_CHARS, TOOLS, Tool as KernelEnvTool, ToolBox, ToolCall
from kernel_env.tools.schema import unwrap
from kernel_env.workspace import state_checks

#: kernel_env's tools offered to an OpenHands agent: all but Finish (OpenHands' own finish ends
#: the conversation).
KERNEL_TOOL_NAMES: tuple[str, ...] = tuple(name for name in TOOLS if name != "Finish")
_READ_ONLY_TOOLS = frozenset({"Read", "Glob", "Grep", "BashOutput"})
#: OpenHands runs `!`command`` in a skill's text on the host when the skill is invoked.
_INLINE_COMMAND = re.compile(r"!`")


class OpenHandsError(RuntimeError):
    """The plug-in cannot be used as asked (the message says why and what to do)."""


# ---------------------------------------------------------------------------------- the workspace


class KernelWorkspace(LocalWorkspace):
    """An OpenHands workspace that is one kernel_env episode.

    ``working_dir`` is the episode's workspace directory on the host (OpenHands' conversation
    needs a local directory); everything the agent does goes through the episode's sandbox,
    where that directory is ``sandbox_workdir`` (``/workspace``). ``execute_command``,
    ``file_upload`` and ``file_download`` run in the sandbox too: paths are relative to the
    workspace, absolute inside the sandbox, or host paths under ``working_dir`` (mapped into it);
    the sandbox refuses anything outside the workspace. Leaving the ``with`` block (or ``close``)
    ends the episode: sandbox stopped, workspace deleted.
    """

    _episode: Episode | None = PrivateAttr(default=None)
    _toolbox: ToolBox | None = PrivateAttr(default=None)

    @classmethod
    def open(cls, task: Task | str, *, language: str | None = None, device: str | None = None, sandbox: str = DEFAULT_SANDBOX,
             pool: GpuPool | str | None = None, settings: EvalSettings | None = None,
             max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, kernelbench_root: str | None = None) -> KernelWorkspace:
        """Open an episode the way KernelAgent-v0's ``reset`` does (same defaults) and wrap it.

        Args:
            task: a Task, or a spec for ``resolve_task``.
            language, device, sandbox, settings: the episode's, as ``Episode.open`` takes them.
            pool: a GpuPool, or a pool kind for this process's shared pool of that kind
                (default: the shared local pool).
            max_output_chars: cap on each tool result's text.
            kernelbench_root: the KernelBench checkout for ``kernelbench/...`` specs.

        Returns:
            The workspace, owning the open episode: use it in a ``with`` block, or ``close`` it.

        Raises:
            TaskError: ``task`` names no task.
            ValueError: an unknown language.
            EpisodeError: a language and device that cannot run here.
            SandboxError: the sandbox cannot be made or started here."""
        task = task if isinstance(task, Task) else resolve_task(task, kernelbench_root=kernelbench_root)
        episode = Episode.open(task, language=language, device=device, sandbox=sandbox,
                               pool=shared_pool(pool) if isinstance(pool, str) else pool, settings=settings)
        return cls.of(episode, max_output_chars=max_output_chars)

    @classmethod
    def of(cls, episode: Episode, *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> KernelWorkspace:
        """Wrap an open episode; the workspace owns it from now on (closing one closes the other)."""
        workspace = cls(working_dir=episode.workspace.path)
        workspace._episode = episode
        workspace._toolbox = ToolBox(episode.sandbox, KERNEL_TOOL_NAMES, max_output_chars=max_output_chars)
        return workspace

    # ------------------------------------------------------------------ the episode

    @property
    def episode(self) -> Episode:
        if self._episode is None:
            raise OpenHandsError("this KernelWorkspace has no open episode (it was closed, or not made with "
                                 "KernelWorkspace.open / KernelWorkspace.of)")
        return self._episode

    @property
    def toolbox(self) -> ToolBox:
        """The episode's tools and the state they share (reads, todos, background jobs)."""
        self.episode  # raises when closed
        assert self._toolbox is not None
        return self._toolbox

    @property
    def language(self) -> str:
        return self.episode.language.name

    @property
    def sandbox_workdir(self) -> str:
        return self.episode.sandbox.workdir

    def final_evaluation(self, selection: Selection = "best") -> EvalResult:
        """``Episode.final_evaluation``: everything the agent started is killed, the solution is
        rebuilt from scratch and evaluated by the trusted harness (see kernel_env.runtime.episode)."""
        return self.episode.final_evaluation(selection)

    def task_prompt(self, max_iterations: int | None = None) -> str:
        """The first user message: the task, where things are, the skill, how the episode ends."""
        episode = self.episode
        task, language = episode.task, episode.language.name
        workdir = self.sandbox_workdir if getattr(episode.sandbox, "isolated", True) else "the workspace"
        budget = f"You have {max_iterations} steps. " if max_iterations else ""
        return (
            f"# Task {task.id}\n\n"
            f"Make the PyTorch model below faster by writing `ModelNew` in model_new.py with {language} kernels in "
            f"kernels/. You work in {workdir} (your current directory), which holds SKILL.md, the reference model.py, "
            f"the build and evaluation scripts in utils/, and a starter model_new.py. Follow the `{language}` skill "
            f"(invoke it first; it is SKILL.md in your workspace).\n\n"
            f"## The reference (model.py)\n\n```python\n{task.code.rstrip()}\n```\n\n"
            f"Your tools run in a sandbox on that workspace. Build with `bash utils/compile.sh`, check "
            f"correctness with `python3 -m utils.verification`, time with `python3 -m utils.profiling`.\n\n"
            f"{budget}When kernels/ and model_new.py hold your final solution, call finish: the solution is then "
            f"rebuilt from scratch and evaluated by the trusted harness, and that evaluation is your result."
        )

    def close(self) -> None:
        """End the episode (sandbox stopped, workspace deleted); idempotent."""
        if self._episode is not None:
            episode, self._episode, self._toolbox = self._episode, None, None
            episode.close()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        try:
            super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            self.close()

    # ------------------------------------------------------------------ OpenHands' workspace API, in the sandbox

    def execute_command(self, command: str, cwd: str | Path | None = None, timeout: float = 30.0) -> CommandResult:
        """Run ``command`` in the sandbox, in a subshell started in ``cwd`` (default: the workspace),
        so the agent's shell session (its cwd, variables) is left as it was. stdout holds stdout
        and stderr interleaved; a command killed at ``timeout`` has exit code -1."""
        where = shlex.quote(self._inside(cwd if cwd is not None else "."))
        result = self.episode.sandbox.exec(f"(\ncd -- {where} || exit 1\n{command}\n)", timeout=timeout)
        return CommandResult(command=command, exit_code=result.exit_code if result.exit_code is not None else -1,
                             stdout=result.output, stderr="", timeout_occurred=result.timed_out)

    def file_upload(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        """Copy a host file into the workspace (written by the sandbox, so links stay inside it)."""
        destination = self._inside(destination_path)
        try:
            data = Path(source_path).read_bytes()
            self.episode.sandbox.write_bytes(destination, data)
        except (OSError, SandboxError) as exc:
            return FileOperationResult(success=False, source_path=str(source_path), destination_path=destination,
                                       error=str(exc))
        return FileOperationResult(success=True, source_path=str(source_path), destination_path=destination,
                                   file_size=len(data))

    def file_download(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        """Copy a workspace file (read by the sandbox) to a host path."""
        source = self._inside(source_path)
        try:
            data = self.episode.sandbox.read_bytes(source)
            destination = Path(destination_path)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(data)
        except (OSError, SandboxError) as exc:
            return FileOperationResult(success=False, source_path=source, destination_path=str(destination_path),
                                       error=str(exc))
        return FileOperationResult(success=True, source_path=source, destination_path=str(destination_path),
                                   file_size=len(data))

    def git_changes(self, path: str | Path) -> list:
        raise OSError("a kernel_env workspace is not a git repository")

    def git_diff(self, path: str | Path) -> Any:
        raise OSError("a kernel_env workspace is not a git repository")

    def _inside(self, path: str | Path) -> str:
        """``path`` as the sandbox names it (lexically; the sandbox resolves links, inside)."""
        workdir = self.sandbox_workdir
        given = PurePosixPath(str(path))
        if given.is_absolute():
            try:
                given = given.relative_to(str(self.working_dir))
            except ValueError:
                return str(given)
        return posixpath.normpath(posixpath.join(workdir, str(given)))


# ---------------------------------------------------------------------------------- the tools


class KernelAction(Action):
    """A call of one kernel_env tool: exactly that tool's arguments (the subclasses are generated
    from each tool's argument model, so the schema the model sees comes from the same types)."""


class KernelObservation(Observation):
    """What a kernel_env tool returned: its text (``content``), ``is_error``, and the structured
    facts of ``ToolResult.data`` (exit code, path, counts, ...)."""

    tool: str = Field(default="", description="The kernel_env tool that produced this observation.")
    data: dict[str, Any] = Field(default_factory=dict, description="Structured facts about the call.")


class KernelToolExecutor(ToolExecutor[KernelAction, KernelObservation]):
    """Runs a call through the episode's ToolBox, in the sandbox. Never raises for anything the
    model sent: ToolBox turns every problem into an error observation."""

    def __init__(self, toolbox: ToolBox, tool: type[KernelEnvTool]):
        self.toolbox = toolbox
        self.tool = tool

    def __call__(self, action: KernelAction, conversation: Any = None) -> KernelObservation:
        arguments = action.model_dump(mode="json", by_alias=True, exclude_unset=True,
                                      include=set(self.tool.Args.model_fields))
        result = self.toolbox.run(ToolCall(name=self.tool.name, arguments=arguments))
        return KernelObservation.from_text(result.output, is_error=result.is_error, tool=result.tool,
                                           data=json.loads(json.dumps(result.data, default=str)))


class KernelTool(ToolDefinition[KernelAction, KernelObservation]):
    """Base of the OpenHands definitions of kernel_env's tools; one subclass per tool (KERNEL_TOOLS)."""

    kernel_tool: ClassVar[type[KernelEnvTool]]
    kernel_action: ClassVar[type[KernelAction]]

    @classmethod
    def create(cls, conv_state: ConversationState | None = None, **params: Any) -> Sequence[Self]:
        """The tool bound to the conversation's KernelWorkspace (ValueError for any other workspace)."""
        if params:
            raise ValueError(f"{cls.__name__} takes no parameters, got {sorted(params)}")
        workspace = conv_state.workspace if conv_state is not None else None
        if not isinstance(workspace, KernelWorkspace):
            raise ValueError(f"the kernel_env tool {cls.name} runs in a kernel_env sandbox: start the conversation "
                             f"with workspace=KernelWorkspace.open(...), not {type(workspace).__name__}")
        read_only = cls.name in _READ_ONLY_TOOLS
        return [cls(description=unwrap(cls.kernel_tool.description), action_type=cls.kernel_action,
                    observation_type=KernelObservation, executor=KernelToolExecutor(workspace.toolbox, cls.kernel_tool),
                    annotations=ToolAnnotations(title=cls.name, readOnlyHint=read_only, destructiveHint=not read_only,
                                                openWorldHint=False))]


def _definition(tool: type[KernelEnvTool]) -> type[KernelTool]:
    fields: dict[str, Any] = {name: (info.annotation, info) for name, info in tool.Args.model_fields.items()}
    action = create_model(f"Kernel{tool.name}Action", __base__=KernelAction, __module__=__name__,
                          __doc__=f"Arguments of kernel_env's {tool.name} tool.", **fields)
    return type(f"Kernel{tool.name}Tool", (KernelTool,), {
        "__module__": __name__, "__doc__": f"kernel_env's {tool.name} tool, run in the episode's sandbox.",
        "name": tool.name, "kernel_tool": tool, "kernel_action": action,
    })


#: Tool name (Bash, Read, ...) -> its OpenHands ToolDefinition class, registered under the class name.
KERNEL_TOOLS: dict[str, type[KernelTool]] = {name: _definition(TOOLS[name]) for name in KERNEL_TOOL_NAMES}
for _tool in KERNEL_TOOLS.values():
    register_tool(_tool.__name__, _tool)


# ---------------------------------------------------------------------------------- skill and agent


def kernel_skill(language: str) -> Skill:
    """The language's SKILL.md as an OpenHands AgentSkills skill (named after the language).

    Its ``source`` is dropped: OpenHands would tell the agent the skill's files are next to the
    package's copy on the host, which the agent cannot see; its own copy is SKILL.md in the
    workspace.

    Args:
        language: cuda, triton or cpp.

    Returns:
        The skill, for an ``AgentContext``'s ``skills``.

    Raises:
        OpenHandsError: the SKILL.md holds inline ``!`command``` text, which OpenHands would run
            on the host."""
    skill = Skill.load(skill_file(language))
    if _INLINE_COMMAND.search(skill.content):
        raise OpenHandsError(f"{skill_file(language)} contains an inline !`command`, which OpenHands would run on "
                             "the host")
    return skill.model_copy(update={"source": None, "content": state_checks(skill.content, None),
                                    "description": state_checks(skill.description or "", None) or None})


def kernel_agent(llm: LLM, language: str, *, tools: Iterable[str] | None = None, **options: Any) -> Agent:
    """An OpenHands Agent with kernel_env's tools and the language's skill; tools other than these
    and OpenHands' built-ins are filtered out.

    Args:
        llm: the model.
        language: the workspace's language (``KernelWorkspace.language``): which skill to load.
        tools: kernel_env tool names (default: all of ``KERNEL_TOOL_NAMES``).
        **options: ``Agent``'s (condenser, system_prompt_kwargs, ...); an ``agent_context`` is
            kept, with the skill added.

    Returns:
        The agent, for ``Conversation(agent=..., workspace=a KernelWorkspace)``.

    Raises:
        ValueError: a tool name that is not in ``KERNEL_TOOL_NAMES``.
        OpenHandsError: as ``kernel_skill``."""
    names = KERNEL_TOOL_NAMES if tools is None else tuple(tools)
    unknown = [name for name in names if name not in KERNEL_TOOLS]
    if unknown:
        raise ValueError(f"unknown kernel_env tools {unknown}; choose from {', '.join(KERNEL_TOOL_NAMES)}")
    context = options.pop("agent_context", None) or AgentContext()
    context = context.model_copy(update={"skills": [*context.skills, kernel_skill(language)]})
    return Agent(llm=llm, tools=[Tool(name=KERNEL_TOOLS[name].__name__) for name in names], agent_context=context,
                 filter_tools_regex="^(?:" + "|".join(map(re.escape, names)) + ")$", **options)


# ---------------------------------------------------------------------------------- one run


@dataclass
class OpenHandsRun:
    """One OpenHands episode: how the conversation ended, the trusted final evaluation, the reward
    (KernelAgent-v0's for the same final evaluation: ``paid_reward``, so 0 when the final
    evaluation failed by the evaluator's fault; ``fault`` says so), and the conversation as JSON."""

    task_id: str
    language: str
    device: str
    #: "finished" (finish, or a reply without tool calls), "max_iterations", "stuck" or "error: ...".
    ended: str
    final: EvalResult
    reward: float
    #: Every trusted evaluation of the episode (the agent's verification/profiling runs, then the final ones).
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    #: OpenHands' events, as JSON.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The conversation as the LLM saw it (chat-completions messages).
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fault(self) -> str | None:
        """Whose fault a failed final evaluation is ("candidate", "evaluator"), None when correct."""
        return self.final.fault

    def summary(self) -> dict[str, Any]:
        """``EvalResult.summary()`` of the final evaluation (``fault`` included), with the episode's reward and ending."""
        return {**self.final.summary(), "episode_reward": self.reward, "ended": self.ended,
                "evaluations": self.evaluations}

    def write(self, directory: str | Path) -> list[Path]:
        """Write events.json, messages.json, result.json (``summary()``) and report.txt; the paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        files = {"events.json": json.dumps(self.events, indent=1), "messages.json": json.dumps(self.messages, indent=1),
                 "result.json": json.dumps(self.summary(), indent=2), "report.txt": model_report(self.final) + "\n"}
        for name, text in files.items():
            (out / name).write_text(text)
        return [out / name for name in files]


def run_openhands(task: Task | str, llm: LLM, *, language: str | None = None, device: str | None = None,
                  sandbox: str = DEFAULT_SANDBOX, pool: GpuPool | str | None = None, settings: EvalSettings | None = None,
                  max_iterations: int = 150, selection: Selection = "best", reward_kind: str = "milestone",
                  tools: Iterable[str] | None = None, output: str | Path | None = None, visualize: bool = False,
                  callbacks: list[Callable[[Event], None]] | None = None, kernelbench_root: str | None = None,
                  **agent_options: Any) -> OpenHandsRun:
    """Run an OpenHands agent on ``task`` until it calls finish (or stops for another reason), then
    run the episode's final evaluation; the episode is closed before returning.

    The defaults are KernelAgent-v0's (150 steps, ``selection="best"``, the milestone reward). The
    conversation ending in an error (the LLM failing, say) still ends the episode with a final
    evaluation of what is in the workspace; ``ended`` says so.

    Args:
        task, language, device, sandbox, pool, settings, kernelbench_root: the episode's, as
            ``KernelWorkspace.open`` takes them.
        llm: the model.
        max_iterations: the agent's steps (OpenHands' ``max_iteration_per_run``).
        selection: which solution the final evaluation counts: "best" or "final".
        reward_kind: what the final evaluation pays: "milestone" or "speedup" (``paid_reward``).
        tools: kernel_env tool names offered (default: all of ``KERNEL_TOOL_NAMES``).
        output: a directory to write the run to (``OpenHandsRun.write``).
        visualize: OpenHands' console rendering of each event.
        callbacks: OpenHands' conversation callbacks, each called with every event.
        **agent_options: ``kernel_agent``'s options (``Agent``'s).

    Returns:
        The run: how it ended, the final evaluation, the reward and the conversation.

    Raises:
        ValueError: ``max_iterations`` below 1, an unknown reward kind, language or tool name.
        And what ``KernelWorkspace.open`` raises (TaskError, EpisodeError, SandboxError)."""
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
    RewardKind(reward_kind)  # an unknown kind fails here, before the episode starts
    with KernelWorkspace.open(task, language=language, device=device, sandbox=sandbox, pool=pool, settings=settings,
                              kernelbench_root=kernelbench_root) as workspace:
        agent = kernel_agent(llm, workspace.language, tools=tools, **agent_options)
        conversation = Conversation(agent=agent, workspace=workspace, max_iteration_per_run=max_iterations,
                                    callbacks=callbacks,
                                    visualizer=DefaultConversationVisualizer if visualize else None)
        try:
            conversation.send_message(workspace.task_prompt(max_iterations))
            failure: ConversationRunError | None = None
            try:
                conversation.run()
            except ConversationRunError as exc:
                failure = exc
            ended = _ending(conversation.state, failure)
            final = workspace.final_evaluation(selection)
            events = list(conversation.state.events)
        finally:
            conversation.close()
        episode = workspace.episode
        run = OpenHandsRun(
            task_id=episode.task.id, language=workspace.language, device=episode.device, ended=ended, final=final,
            reward=paid_reward(final, reward_kind),
            evaluations=[result.summary() for result in episode.results],
            events=[event.model_dump(mode="json") for event in events],
            messages=llm.format_messages_for_llm(
                LLMConvertibleEvent.events_to_messages([e for e in events if isinstance(e, LLMConvertibleEvent)])),
        )
    if output is not None:
        run.write(output)
    return run


def _ending(state: ConversationState, failure: ConversationRunError | None) -> str:
    status = state.execution_status
    if status == ConversationExecutionStatus.FINISHED:
        return "finished"
    if status == ConversationExecutionStatus.STUCK:
        return "stuck"
    errors = [event for event in state.events if isinstance(event, ConversationErrorEvent)]
    if errors and errors[-1].code == "MaxIterationsReached":
        return "max_iterations"
    if failure is not None:
        cause = failure.__cause__ or failure
        return f"error: {type(cause).__name__}: {cause}"
    if errors:
        return f"error: {errors[-1].code}: {errors[-1].detail}"
    return f"stopped ({status.value})"


__all__ = ["KERNEL_TOOLS", "KERNEL_TOOL_NAMES", "KernelAction", "KernelObservation", "KernelTool", "KernelToolExecutor",
           "KernelWorkspace", "OpenHandsError", "OpenHandsRun", "kernel_agent", "kernel_skill", "run_openhands"]
