"""OpenAI function-calling schemas, generated from each tool's argument model.

Nothing here is written by hand: pydantic produces the JSON schema and ``clean_schema``
makes it what a model (and strict-schema servers such as vLLM's guided decoding) handles
best: no ``title`` noise, ``$ref`` inlined, ``X | None`` collapsed to ``X``, no
``default: null``, objects closed with ``additionalProperties: false``.
"""

from __future__ import annotations

import copy
from typing import Any

from kernel_env.tools.base import Tool

# Keys whose value is a mapping of name -> schema, a schema, or a list of schemas.
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def openai_schema(tool: type[Tool] | Tool) -> dict[str, Any]:
    """``{"type": "function", "function": {"name", "description", "parameters"}}`` for one tool."""
    raw = tool.Args.model_json_schema(by_alias=True, mode="validation")
    parameters = clean_schema(raw)
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    return {
        "type": "function",
        "function": {"name": tool.name, "description": unwrap(tool.description), "parameters": parameters},
    }


def unwrap(text: str) -> str:
    """Join hard-wrapped lines; keep "- " bullets and blank lines as line breaks."""
    out: list[str] = []
    for line in text.strip().splitlines():
        stripped = line.strip()
        if out and stripped and not stripped.startswith("- ") and out[-1]:
            out[-1] += " " + stripped
        else:
            out.append(stripped)
    return "\n".join(out)


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A self-contained, title-free copy of a pydantic JSON schema."""
    defs = schema.get("$defs", {})
    return _clean(copy.deepcopy(schema), defs)


def _clean(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        target = copy.deepcopy(defs[name])
        # Keep the field's own description over the referenced model's docstring.
        node = {**target, **node}
    node.pop("$defs", None)
    node.pop("title", None)
    if "default" in node and node["default"] is None:
        del node["default"]

    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {name: _clean(sub, defs) for name, sub in node[key].items()}
    for key in _SCHEMA_VALUES:
        if isinstance(node.get(key), dict):
            node[key] = _clean(node[key], defs)
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_clean(sub, defs) for sub in node[key]]

    # ``X | None`` with a None default is just an optional X for the model.
    options = node.get("anyOf")
    if isinstance(options, list):
        non_null = [opt for opt in options if opt.get("type") != "null"]
        if len(non_null) == 1 and len(non_null) < len(options):
            del node["anyOf"]
            node = {**non_null[0], **node}

    if node.get("type") == "object" and "properties" in node:
        node.setdefault("additionalProperties", False)
        node["required"] = [name for name in node.get("required", []) if name in node["properties"]]
    return node
