"""NotebookEdit: replace, insert or delete one cell of a Jupyter notebook (.ipynb JSON)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Literal

from pydantic import Field

from kernel_env.tools.base import Tool, ToolArgs, ToolContext, ToolError, ToolResult
from kernel_env.tools.files import read_text

_INDEX_ID = re.compile(r"^(?:cell-)?(\d+)$")


class NotebookEditArgs(ToolArgs):
    notebook_path: str = Field(description="The .ipynb file to edit (relative to the workspace, or absolute under it).")
    cell_id: str | None = Field(
        None,
        description="The id of the cell to replace or delete, or after which to insert (as Read shows it; "
        "'cell-N' or 'N' for the N-th cell, from 0). Insert without a cell_id puts the cell first.",
    )
    new_source: str | None = Field(None, description="The new source of the cell (required for replace and insert).")
    cell_type: Literal["code", "markdown"] | None = Field(
        None, description="The cell's type; required for insert, and changes the cell's type on replace."
    )
    edit_mode: Literal["replace", "insert", "delete"] = Field("replace", description="What to do with the cell.")


class NotebookEdit(Tool):
    name = "NotebookEdit"
    Args = NotebookEditArgs
    description = """\
Edit a Jupyter notebook (.ipynb) cell: replace a cell's source, insert a new cell after a given
cell (or first), or delete a cell. Read the notebook first to see its cells and their ids.
Replacing a code cell clears its outputs."""

    def run(self, args: NotebookEditArgs, ctx: ToolContext) -> ToolResult:
        path = ctx.resolve_writable(args.notebook_path, what="notebook_path")
        if not path.rel.endswith(".ipynb"):
            raise ToolError(f"{path.rel} is not a notebook (.ipynb); use Edit for other files")
        if args.edit_mode in ("replace", "insert") and args.new_source is None:
            raise ToolError(f"new_source is required for edit_mode={args.edit_mode!r}")
        if args.edit_mode == "insert" and args.cell_type is None:
            raise ToolError("cell_type ('code' or 'markdown') is required for edit_mode='insert'")
        if args.edit_mode != "insert" and not args.cell_id:
            raise ToolError(f"cell_id is required for edit_mode={args.edit_mode!r}; Read the notebook to see the cell ids")

        try:
            nb = json.loads(read_text(ctx, path))
            cells = nb["cells"]
            if not isinstance(cells, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ToolError(f"{path.rel} is not a valid notebook (a JSON object with a 'cells' list)") from None

        index = _find_cell(cells, args.cell_id, path.rel) if args.cell_id else None
        if args.edit_mode == "delete":
            removed = cells.pop(index)
            summary = f"Deleted cell {_cell_name(removed, index)} from {path.rel}."
            cell_id = removed.get("id") if isinstance(removed, dict) else None
        elif args.edit_mode == "insert":
            cell = _new_cell(args.cell_type, args.new_source, with_id=_uses_ids(nb, cells))
            position = 0 if index is None else index + 1
            cells.insert(position, cell)
            summary = f"Inserted a {args.cell_type} cell at position {position} of {path.rel}."
            cell_id = cell.get("id")
        else:
            cell = cells[index]
            if not isinstance(cell, dict):
                raise ToolError(f"cell {args.cell_id} of {path.rel} is not a JSON object")
            cell["source"] = _lines(args.new_source)
            if args.cell_type and args.cell_type != cell.get("cell_type"):
                cell["cell_type"] = args.cell_type
            if cell.get("cell_type") == "code":
                cell["outputs"] = []
                cell["execution_count"] = None
                cell.setdefault("metadata", {})
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
            summary = f"Replaced the source of cell {_cell_name(cell, index)} in {path.rel}."
            cell_id = cell.get("id")

        ctx.sandbox.write_bytes(path.sandbox_path, (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
        return ToolResult(output=summary, data={"path": path.rel, "edit_mode": args.edit_mode, "cell_id": cell_id, "cells": len(cells)})


def _find_cell(cells: list, cell_id: str, rel: str) -> int:
    for index, cell in enumerate(cells):
        if isinstance(cell, dict) and cell.get("id") == cell_id:
            return index
    by_index = _INDEX_ID.match(cell_id.strip())
    if by_index and int(by_index.group(1)) < len(cells):
        return int(by_index.group(1))
    known = [_cell_name(cell, i) for i, cell in enumerate(cells)][:20]
    raise ToolError(f"no cell {cell_id!r} in {rel}; its cells are: {', '.join(known) or 'none'}")


def _cell_name(cell, index: int) -> str:
    return cell.get("id") if isinstance(cell, dict) and cell.get("id") else f"cell-{index}"


def _uses_ids(nb: dict, cells: list) -> bool:
    """Cell ids exist from nbformat 4.5 on; older notebooks must not get them."""
    if any(isinstance(c, dict) and "id" in c for c in cells):
        return True
    try:
        return (int(nb.get("nbformat", 4)), int(nb.get("nbformat_minor", 0))) >= (4, 5)
    except (TypeError, ValueError):
        return False


def _new_cell(cell_type: str, source: str, *, with_id: bool) -> dict:
    cell: dict = {"cell_type": cell_type, "metadata": {}, "source": _lines(source)}
    if with_id:
        cell["id"] = uuid.uuid4().hex[:8]
    if cell_type == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    return cell


def _lines(source: str) -> list[str]:
    """nbformat's convention: the source as a list of lines, each keeping its newline."""
    return source.splitlines(keepends=True)
