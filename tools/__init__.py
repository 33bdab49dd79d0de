"""The agent's tools: Bash, Read, Write, Edit, MultiEdit, Glob, Grep, TodoWrite, BashOutput,
KillBash, NotebookEdit and Finish, with Claude Code's argument names, run against a ``Sandbox``.

::

    box = ToolBox(sandbox)                  # one per episode; ToolBox(sandbox, ["Bash", "Read"]) for a subset
    box.schemas()                           # OpenAI function-calling specs for the model
    result = box.run({"name": "Read", "arguments": {"file_path": "model.py"}})
    result.output, result.is_error, result.data

Tools never touch the host file system and never raise into the caller: every problem is an
error result the model can read.
"""

from kernel_env.tools.base import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolContext, ToolError, ToolResult
from kernel_env.tools.calls import ToolCall, parse_tool_calls
from kernel_env.tools.schema import openai_schema
from kernel_env.tools.toolbox import ALL_TOOL_NAMES, TOOLS, ToolBox, tool_schemas

__all__ = [
    "ALL_TOOL_NAMES",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "TOOLS",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "openai_schema",
    "parse_tool_calls",
    "tool_schemas",
]
