"""Tool calls as the model emits them, parsed without ever raising.

An action can be a dict ``{"name", "arguments"}``, a JSON string of one, a list of either,
an OpenAI tool call ``{"id", "type": "function", "function": {"name", "arguments": "<json>"}}``
or an Anthropic ``tool_use`` block ``{"id", "name", "input"}``. Anything else (None, binary
junk, broken JSON, a number) still parses: into a ``ToolCall`` whose ``error`` says what
was wrong, so the environment answers it with an observation and the episode goes on.
Argument *values* are checked later, against the tool's model, by ``ToolBox.run``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

_EXPECTED = 'expected a tool call like {"name": "Read", "arguments": {"file_path": "model.py"}}'
_FENCE = re.compile(r"^```(?:json)?\s*\n(.*?)\n?```\s*$", re.DOTALL)


class ToolCall(BaseModel):
    """One call of a tool by name. ``error`` is set when the model's action could not be parsed."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None
    error: str | None = None

    @classmethod
    def invalid(cls, error: str, *, name: str = "", id: str | None = None) -> ToolCall:
        return cls(name=name, error=error, id=id)


def parse_tool_calls(action: Any) -> list[ToolCall]:
    """Every tool call in ``action``, in order; malformed ones carry an ``error``. Never raises."""
    try:
        return _parse_action(action)
    except RecursionError:
        return [ToolCall.invalid(f"the action is nested too deeply; {_EXPECTED}")]


def _parse_action(action: Any) -> list[ToolCall]:
    if isinstance(action, ToolCall):
        return [action]
    if action is None:
        return [ToolCall.invalid(f"the action is empty (None); {_EXPECTED}")]
    if isinstance(action, (bytes, bytearray, memoryview)):
        try:
            action = bytes(action).decode("utf-8")
        except UnicodeDecodeError:
            return [ToolCall.invalid(f"the action is binary data ({len(action)} bytes), not UTF-8 text; {_EXPECTED}")]
    if isinstance(action, str):
        return _parse_text(action)
    if isinstance(action, Mapping):
        return [_parse_one(action)]
    if isinstance(action, (list, tuple)):
        if not action:
            return [ToolCall.invalid(f"the action is an empty list; {_EXPECTED}")]
        calls = []
        for index, item in enumerate(action):
            for call in _parse_action(item) if not isinstance(item, (list, tuple)) else [
                ToolCall.invalid(f"item {index} of the action is a nested list; {_EXPECTED}")
            ]:
                calls.append(call)
        return calls
    return [ToolCall.invalid(f"the action is a {type(action).__name__}, not a tool call; {_EXPECTED}")]


def _parse_text(text: str) -> list[ToolCall]:
    stripped = text.strip()
    if not stripped:
        return [ToolCall.invalid(f"the action is an empty string; {_EXPECTED}")]
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    try:
        value = json.loads(stripped)
    except (json.JSONDecodeError, ValueError) as exc:
        preview = stripped[:80] + ("…" if len(stripped) > 80 else "")
        return [ToolCall.invalid(f"the action is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {preview!r}; {_EXPECTED}")]
    if isinstance(value, str):
        return [ToolCall.invalid(f"the action is a JSON string, not an object; {_EXPECTED}")]
    return _parse_action(value)


def _parse_one(raw: Mapping) -> ToolCall:
    call_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    body: Mapping = raw
    if isinstance(raw.get("function"), Mapping):  # OpenAI: {"id", "type": "function", "function": {...}}
        body = raw["function"]
    elif "function" in raw:
        return ToolCall.invalid(f"'function' must be an object with 'name' and 'arguments'; {_EXPECTED}", id=call_id)

    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        shown = "missing" if name is None else f"{type(name).__name__} {name!r}"[:80]
        return ToolCall.invalid(f"the tool call has no tool name (name is {shown}); {_EXPECTED}", id=call_id)
    name = name.strip()

    for key in ("arguments", "input", "parameters"):
        if key in body:
            arguments = body[key]
            break
    else:
        arguments = {}
    if isinstance(arguments, (bytes, bytearray)):
        try:
            arguments = bytes(arguments).decode("utf-8")
        except UnicodeDecodeError:
            return ToolCall.invalid(f"the arguments of {name} are binary data, not a JSON object", name=name, id=call_id)
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, ValueError) as exc:
                return ToolCall.invalid(f"the arguments of {name} are not valid JSON ({exc.msg} at column {exc.colno}); send a JSON object of argument names to values", name=name, id=call_id)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return ToolCall.invalid(f"the arguments of {name} must be a JSON object of argument names to values, not a {type(arguments).__name__}", name=name, id=call_id)
    if not all(isinstance(key, str) for key in arguments):
        return ToolCall.invalid(f"the argument names of {name} must be strings", name=name, id=call_id)
    return ToolCall(name=name, arguments=dict(arguments), id=call_id)
