"""TodoWrite: the agent's own task list, kept per episode and echoed back rendered."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kernel_env.tools.base import Tool, ToolArgs, ToolContext, ToolError, ToolResult

Status = Literal["pending", "in_progress", "completed"]
_MARK = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]"}


class TodoItem(ToolArgs):
    """One task."""

    # Older Claude Code todo items carry "id" and "priority": accept and drop them.
    model_config = ConfigDict(extra="ignore")

    content: str = Field(min_length=1, description="What to do, in the imperative (e.g. 'Fuse the add and relu kernels').")
    status: Status = Field(description="pending, in_progress (at most one task at a time) or completed.")
    activeForm: str | None = Field(None, description="The task in the present continuous, shown while in progress (e.g. 'Fusing the kernels').")


class TodoWriteArgs(ToolArgs):
    todos: list[TodoItem] = Field(description="The complete, updated todo list (it replaces the previous one).")


class TodoWrite(Tool):
    name = "TodoWrite"
    Args = TodoWriteArgs
    description = """\
Create or update your task list for this session; each call replaces the whole list. Use it for
multi-step work (profile, write kernels, compile, verify, optimise): mark a task in_progress when
you start it (at most one at a time) and completed as soon as it is done."""

    def run(self, args: TodoWriteArgs, ctx: ToolContext) -> ToolResult:
        active = [item.content for item in args.todos if item.status == "in_progress"]
        if len(active) > 1:
            raise ToolError(f"{len(active)} tasks are in_progress ({'; '.join(active)}); keep at most one in_progress. The list was not changed.")
        ctx.todos = list(args.todos)
        return ToolResult(output=render_todos(ctx.todos), data={"todos": [item.model_dump() for item in ctx.todos]})


def render_todos(todos: list[TodoItem]) -> str:
    if not todos:
        return "Todo list cleared (no tasks)."
    counts = {status: sum(item.status == status for item in todos) for status in _MARK}
    lines = ["Todo list updated:"]
    for number, item in enumerate(todos, start=1):
        line = f"{_MARK[item.status]} {number}. {item.content}"
        if item.status == "in_progress" and item.activeForm:
            line += f"  ({item.activeForm})"
        lines.append(line)
    lines.append(f"({counts['completed']} completed, {counts['in_progress']} in progress, {counts['pending']} pending)")
    return "\n".join(lines)
