"""ToolBox: the tools of one episode, bound to its sandbox.

``ToolBox.run`` is the one entry point the environments use: it takes whatever the model
produced, validates it against the tool's argument model, runs the tool and returns a
``ToolResult``. It never raises: a malformed call, a refused path, a sandbox error or a bug
in a tool all come back as an error result naming the tool (bugs are logged with their
traceback; the model sees one line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from kernel_env.sandbox.base import Sandbox, SandboxError
from kernel_env.tools.base import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolContext, ToolError, ToolResult, truncate_middle
from kernel_env.tools.calls import ToolCall, parse_tool_calls
from kernel_env.tools.files import Edit, MultiEdit, Read, Write
from kernel_env.tools.finish import Finish
from kernel_env.tools.notebook import NotebookEdit
from kernel_env.tools.schema import openai_schema
from kernel_env.tools.search import Glob, Grep
from kernel_env.tools.shell import Bash, BashOutput, KillBash
from kernel_env.tools.todo import TodoWrite

log = logging.getLogger(__name__)

#: Every tool, in the order the model sees them (the CUDA Agent paper's / Claude Code's set, and
#: Finish, which ends an environment's episode).
TOOLS: dict[str, type[Tool]] = {
    tool.name: tool
    for tool in (Bash, Read, Write, Edit, MultiEdit, Glob, Grep, TodoWrite, BashOutput, KillBash, NotebookEdit, Finish)
}
ALL_TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)


def _select(names: Iterable[str] | None) -> dict[str, type[Tool]]:
    if names is None:
        return dict(TOOLS)
    if isinstance(names, str):
        names = [names]
    wanted = set(names)
    for name in wanted - set(TOOLS):
        raise ValueError(f"unknown tool {name!r}; the tools are: {', '.join(ALL_TOOL_NAMES)}")
    return {name: tool for name, tool in TOOLS.items() if name in wanted}


def tool_schemas(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI function-calling specs of the named tools (default: all), in ALL_TOOL_NAMES order."""
    return [openai_schema(tool) for tool in _select(names).values()]


class ToolBox:
    """The tools of one episode and the state they share (reads, todos, background jobs).

    ``tools`` picks the enabled tools by name (default: all of ``ALL_TOOL_NAMES``); an unknown
    name raises ValueError here, at construction. ``max_output_chars`` caps every result's text.
    """

    def __init__(self, sandbox: Sandbox, tools: Iterable[str] | None = None, *,
                 max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS):
        self.sandbox = sandbox
        self._tools = {name: cls() for name, cls in _select(tools).items()}
        self.context = ToolContext(sandbox=sandbox, max_output_chars=max_output_chars)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling specs of the enabled tools."""
        return tool_schemas(self.names)

    @property
    def todos(self) -> list:
        return list(self.context.todos)

    # ------------------------------------------------------------------ running

    def run(self, call: ToolCall | Any) -> ToolResult:
        """Run one tool call; never raises. Anything not a ToolCall is parsed first (one call expected)."""
        if not isinstance(call, ToolCall):
            calls = parse_tool_calls(call)
            if len(calls) != 1:
                return ToolResult(output=f"expected one tool call, got {len(calls)}; send them one at a time (or use run_all)",
                                  is_error=True, data={"error_kind": "parse"})
            call = calls[0]
        try:
            result = self._run(call)
        except Exception:  # a bug in a tool: the model gets one line, the log gets the traceback
            log.exception("tool %s failed on arguments %r", call.name, call.arguments)
            result = ToolResult(output=f"{call.name}: internal error in the tool; this is not your fault. Try again or use another tool.",
                                is_error=True, data={"error_kind": "internal"})
        result.tool = result.tool or call.name
        result.call_id = call.id
        result.output, cut = truncate_middle(result.output, self.context.max_output_chars)
        if cut:
            result.data["output_truncated"] = True
        return result

    def run_all(self, action: Any) -> list[ToolResult]:
        """Parse an action (one call, a JSON string, a list, ...) and run every call in order; never raises."""
        return [self.run(call) for call in parse_tool_calls(action)]

    async def arun(self, call: ToolCall | Any) -> ToolResult:
        """``run`` in a worker thread, for event loops stepping many episodes."""
        return await asyncio.to_thread(self.run, call)

    async def arun_all(self, action: Any) -> list[ToolResult]:
        return await asyncio.to_thread(self.run_all, action)

    def _run(self, call: ToolCall) -> ToolResult:
        if call.error:
            return ToolResult(output=f"invalid tool call: {call.error}", is_error=True, tool=call.name, data={"error_kind": "parse"})
        tool = self._lookup(call.name)
        if tool is None:
            return ToolResult(
                output=f"unknown tool {call.name!r}; the available tools are: {', '.join(self._tools)}",
                is_error=True, data={"error_kind": "unknown_tool"},
            )
        try:
            args = tool.Args.model_validate(call.arguments)
        except ValidationError as exc:
            return ToolResult(output=f"{tool.name}: invalid arguments: {_explain(exc, tool)}", is_error=True, tool=tool.name,
                              data={"error_kind": "invalid_arguments"})
        try:
            result = tool.run(args, self.context)
        except (ToolError, SandboxError) as exc:
            return ToolResult(output=f"{tool.name}: {exc}", is_error=True, tool=tool.name, data={"error_kind": "tool_error"})
        result.tool = tool.name
        return result

    def _lookup(self, name: str) -> Tool | None:
        if name in self._tools:
            return self._tools[name]
        folded = {key.lower(): tool for key, tool in self._tools.items()}
        return folded.get(name.lower())


def _explain(exc: ValidationError, tool: Tool) -> str:
    """One line per problem, naming the argument, for the model."""
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "missing":
            problems.append(f"missing required argument '{where}'")
        elif error["type"] == "extra_forbidden":
            problems.append(f"unexpected argument '{where}'")
        else:
            given = repr(error.get("input"))
            given = given if len(given) <= 60 else given[:57] + "..."
            problems.append(f"'{where}': {error['msg']} (got {given})")
    accepted = ", ".join(
        (field.alias or name) + ("" if field.is_required() else "?") for name, field in tool.Args.model_fields.items()
    )
    return "; ".join(problems) + f". {tool.name} takes: {accepted} (? = optional)."
