"""Read, Write, Edit, MultiEdit: the agent's file tools.

Every byte goes through ``Sandbox.read_bytes`` / ``write_bytes`` / ``stat``, which run inside
the sandbox with its privileges (symlinks are resolved there, so a planted link cannot reach
the host). Here we add what makes the tools safe to use blind: paths checked up front,
protected files refused with a pointer to where to work, read-before-overwrite for Write,
unique-match edits, and atomic multi-edits.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from pydantic import Field

from kernel_env.sandbox.base import FileInfo
from kernel_env.tools.base import OWNED_HINT, PROTECTED_HINT, ReadRecord, Tool, ToolArgs, ToolContext, ToolError, ToolResult, WorkspacePath, plural

DEFAULT_READ_LINES = 2000
MAX_LINE_CHARS = 2000
_SNIPPET_CONTEXT = 3
_SNIPPET_MAX_LINES = 40
_LINE_NUMBER_PREFIX = re.compile(r"^\s*\d+\t", re.MULTILINE)

_PATHS = "Paths are relative to the workspace, or absolute under it."


# ---------------------------------------------------------------------- helpers


def read_text(ctx: ToolContext, path: WorkspacePath) -> str:
    """A file's text, or ToolError for directories and binary files (missing files: SandboxError)."""
    data = ctx.sandbox.read_bytes(path.sandbox_path)
    return decode_text(path, data)


def decode_text(path: WorkspacePath, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path.rel} is a binary file ({len(data)} bytes); only text files can be shown or edited. Inspect it with Bash (e.g. `xxd {path.rel} | head`).")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path.rel} is not UTF-8 text ({len(data)} bytes); only text files can be shown or edited. Inspect it with Bash.") from None


def number_lines(lines: list[str], first: int) -> str:
    """``cat -n`` style: right-aligned line number, a tab, the line (very long lines cut)."""
    out = []
    for n, line in enumerate(lines, start=first):
        if len(line) > MAX_LINE_CHARS:
            line = f"{line[:MAX_LINE_CHARS]}... [line truncated: {len(line) - MAX_LINE_CHARS} more characters]"
        out.append(f"{n:>6}\t{line}")
    return "\n".join(out)


def snippet(text: str, at: int, length: int) -> str:
    """Numbered lines around ``text[at:at + length]``, to show the agent what an edit produced."""
    lines = text.splitlines()
    first = text.count("\n", 0, at)
    last = first + text.count("\n", at, at + length)
    start = max(0, first - _SNIPPET_CONTEXT)
    end = min(len(lines), last + _SNIPPET_CONTEXT + 1)
    cut = end - start > _SNIPPET_MAX_LINES
    if cut:
        end = start + _SNIPPET_MAX_LINES
    shown = number_lines(lines[start:end], start + 1)
    return shown + ("\n   ...\t[snippet cut; Read the file to see the rest]" if cut else "")


def write_text(ctx: ToolContext, path: WorkspacePath, text: str) -> None:
    ctx.sandbox.write_bytes(path.sandbox_path, text.encode("utf-8"))
    ctx.remember(path)


def _check_fresh(ctx: ToolContext, path: WorkspacePath) -> FileInfo | None:
    """Stat ``path``; if it exists, it must have been read (or written by us) and be unchanged since."""
    info = ctx.sandbox.stat(path.sandbox_path)
    if info is None:
        return None
    if info.is_dir:
        raise ToolError(f"{path.rel} is a directory, not a file")
    record = ctx.reads.get(path.sandbox_path)
    if record is None:
        raise ToolError(
            f"{path.rel} already exists and you have not read it. Read it first (Write replaces the "
            "whole file), or use Edit to change part of it."
        )
    if not record.matches(info):
        raise ToolError(f"{path.rel} has changed since you last read it (e.g. by a command). Read it again before overwriting it.")
    return info


# ---------------------------------------------------------------------- Read


class ReadArgs(ToolArgs):
    file_path: str = Field(description="The file to read (relative to the workspace, or absolute under it).")
    offset: int | None = Field(None, ge=0, description="The line number to start reading from (1 = first line). Only for large files.")
    limit: int | None = Field(None, ge=1, description=f"The number of lines to read (default {DEFAULT_READ_LINES}).")


class Read(Tool):
    name = "Read"
    Args = ReadArgs
    description = f"""\
Read a text file from the workspace. {_PATHS}
- Output is numbered like `cat -n`: line number, a tab, then the line. The number and tab are not
  part of the file: never include them in Edit's old_string.
- Reads up to {DEFAULT_READ_LINES} lines from the start by default; use offset (1-based line) and limit for
  more. Lines longer than {MAX_LINE_CHARS} characters are cut.
- Jupyter notebooks (.ipynb) are shown cell by cell with their ids (for NotebookEdit).
- Binary files and directories cannot be read (use Bash `ls` for directories).
- Read a file before overwriting it with Write."""

    def run(self, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        path = ctx.resolve(args.file_path, what="file_path")
        info = ctx.sandbox.stat(path.sandbox_path)
        if info is None:
            raise ToolError(f"{path.rel} does not exist. Use Glob to find files (e.g. pattern '**/*.cu').")
        if info.is_dir:
            raise ToolError(f"{path.rel} is a directory, not a file; list it with Bash (`ls {path.rel}`) or Glob.")
        data = ctx.sandbox.read_bytes(path.sandbox_path)
        text = decode_text(path, data)
        ctx.reads[path.sandbox_path] = _record(info, data)

        if path.rel.endswith(".ipynb"):
            rendered = _render_notebook(text)
            if rendered is not None:
                return ToolResult(output=rendered, data={"path": path.rel, "notebook": True})

        if not text:
            return ToolResult(output=f"(the file {path.rel} is empty)", data={"path": path.rel, "total_lines": 0})
        lines = text.splitlines()
        total = len(lines)
        first = max(args.offset or 1, 1)
        if first > total:
            raise ToolError(f"offset {first} is past the end of {path.rel}, which has {plural(total, 'line')}")
        count = args.limit or DEFAULT_READ_LINES
        shown = lines[first - 1:first - 1 + count]
        last = first + len(shown) - 1
        output = number_lines(shown, first)
        if first > 1 or last < total:
            more = f"; continue with offset={last + 1}" if last < total else ""
            output += f"\n[showing lines {first}-{last} of {total}{more}]"
        return ToolResult(output=output, data={"path": path.rel, "first_line": first, "last_line": last, "total_lines": total})


def _record(info: FileInfo, data: bytes) -> ReadRecord:
    # The stat came before the read; if the file changed in between, the size tells (mostly).
    return ReadRecord(mtime=info.mtime, size=info.size if info.size == len(data) else -1)


def _render_notebook(text: str) -> str | None:
    try:
        nb = json.loads(text)
        cells = nb["cells"]
        assert isinstance(cells, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        return None  # not a notebook we understand: show it as text
    if not cells:
        return "(the notebook has no cells)"
    out = []
    for index, cell in enumerate(cells):
        if not isinstance(cell, dict):
            continue
        cell_id = cell.get("id") or f"cell-{index}"
        out.append(f'<cell id="{cell_id}" index="{index}" type="{cell.get("cell_type", "?")}">')
        out.append(_source(cell).rstrip("\n"))
        texts = []
        for output in cell.get("outputs") or []:
            if not isinstance(output, dict):
                continue
            if "text" in output:
                texts.append(_join(output["text"]))
            elif isinstance(output.get("data"), dict) and "text/plain" in output["data"]:
                texts.append(_join(output["data"]["text/plain"]))
            elif output.get("output_type") == "error":
                texts.append(f"{output.get('ename')}: {output.get('evalue')}")
        if texts:
            out.append("<outputs>\n" + "".join(t if t.endswith("\n") else t + "\n" for t in texts).rstrip("\n") + "\n</outputs>")
        out.append("</cell>")
    return "\n".join(out)


def _join(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _source(cell: dict) -> str:
    return _join(cell.get("source", ""))


# ---------------------------------------------------------------------- Write


class WriteArgs(ToolArgs):
    file_path: str = Field(description="The file to write (relative to the workspace, or absolute under it).")
    content: str = Field(description="The complete new content of the file.")


class Write(Tool):
    name = "Write"
    Args = WriteArgs
    description = f"""\
Create a file, or replace a file's whole content. {_PATHS} Parent directories are created.
- An existing file must have been Read first in this session (and not changed since); prefer
  Edit for changing part of a file.
- Protected files ({PROTECTED_HINT}) are read-only:
  write your code in {OWNED_HINT}."""

    def run(self, args: WriteArgs, ctx: ToolContext) -> ToolResult:
        path = ctx.resolve_writable(args.file_path)
        existed = _check_fresh(ctx, path) is not None
        write_text(ctx, path, args.content)
        lines = len(args.content.splitlines())
        verb = "Overwrote" if existed else "Created"
        return ToolResult(
            output=f"{verb} {path.rel} ({plural(lines, 'line')}, {plural(len(args.content.encode()), 'byte')}).",
            data={"path": path.rel, "created": not existed, "bytes": len(args.content.encode())},
        )


# ---------------------------------------------------------------------- Edit / MultiEdit


OldString = Annotated[str, Field(description="The exact text to replace (must match the file, whitespace included).")]
NewString = Annotated[str, Field(description="The text to replace it with (must differ from old_string).")]
ReplaceAll = Annotated[bool, Field(description="Replace every occurrence instead of requiring exactly one.")]


class EditOp(ToolArgs):
    """One replacement."""

    old_string: OldString
    new_string: NewString
    replace_all: ReplaceAll = False


def apply_edit(text: str, op: EditOp, rel: str, *, new_file: bool) -> tuple[str, int, int]:
    """Apply one edit to ``text``; returns (new text, occurrences replaced, offset of the first).

    Raises ToolError when the edit cannot be applied as asked.
    """
    if op.old_string == op.new_string:
        raise ToolError("old_string and new_string are identical; nothing would change")
    if op.old_string == "":
        if new_file or text == "":
            return op.new_string, 1, 0
        raise ToolError(f"old_string is empty, but {rel} is not empty; give the exact text to replace (an empty old_string only creates a new file)")
    count = text.count(op.old_string)
    if count == 0:
        hint = "old_string must match the file exactly, including whitespace and indentation; Read the file again to see its current content."
        if _LINE_NUMBER_PREFIX.search(op.old_string) and op.old_string not in text:
            hint = "old_string seems to include the line-number prefixes that Read shows; copy only the text after the tab."
        raise ToolError(f"old_string was not found in {rel}. {hint}")
    if count > 1 and not op.replace_all:
        raise ToolError(
            f"old_string occurs {count} times in {rel}; include more surrounding lines to make it unique, "
            "or set replace_all=true to replace every occurrence."
        )
    first = text.index(op.old_string)
    if op.replace_all:
        return text.replace(op.old_string, op.new_string), count, first
    return text[:first] + op.new_string + text[first + len(op.old_string):], 1, first


def _load_for_edit(ctx: ToolContext, path: WorkspacePath, ops: list[EditOp]) -> tuple[str, bool, bool]:
    """The current text, whether the file is new, and whether our read record of it was fresh."""
    info = ctx.sandbox.stat(path.sandbox_path)
    if info is None:
        if ops and ops[0].old_string == "":
            return "", True, False
        raise ToolError(f"{path.rel} does not exist. To create it, use Write (or an edit with an empty old_string).")
    if info.is_dir:
        raise ToolError(f"{path.rel} is a directory, not a file")
    record = ctx.reads.get(path.sandbox_path)
    return read_text(ctx, path), False, record is not None and record.matches(info)


def _commit_edit(ctx: ToolContext, path: WorkspacePath, text: str, was_fresh: bool, new_file: bool) -> None:
    ctx.sandbox.write_bytes(path.sandbox_path, text.encode("utf-8"))
    # The agent knows the whole file after an edit only if it knew it before.
    if was_fresh or new_file:
        ctx.remember(path)


class EditArgs(ToolArgs):
    file_path: str = Field(description="The file to edit (relative to the workspace, or absolute under it).")
    old_string: OldString
    new_string: NewString
    replace_all: ReplaceAll = False


class Edit(Tool):
    name = "Edit"
    Args = EditArgs
    description = f"""\
Replace text in a file. {_PATHS}
- old_string must match the file exactly (whitespace and indentation included) and occur exactly
  once, unless replace_all is true (then every occurrence is replaced). Add surrounding lines to
  make it unique. Read the file first so you copy the text exactly, without Read's line-number
  prefixes.
- new_string must differ from old_string. An empty old_string creates a new file.
- Protected files ({PROTECTED_HINT}) are read-only."""

    def run(self, args: EditArgs, ctx: ToolContext) -> ToolResult:
        path = ctx.resolve_writable(args.file_path)
        op = EditOp(old_string=args.old_string, new_string=args.new_string, replace_all=args.replace_all)
        text, new_file, fresh = _load_for_edit(ctx, path, [op])
        new_text, count, at = apply_edit(text, op, path.rel, new_file=new_file)
        _commit_edit(ctx, path, new_text, fresh, new_file)
        if new_file:
            summary = f"Created {path.rel} ({plural(len(new_text.splitlines()), 'line')})."
        else:
            summary = f"Edited {path.rel}: replaced {plural(count, 'occurrence')}."
        return ToolResult(
            output=f"{summary}\n{snippet(new_text, at, len(op.new_string))}" if new_text else summary,
            data={"path": path.rel, "replacements": count, "created": new_file},
        )


class MultiEditArgs(ToolArgs):
    file_path: str = Field(description="The file to edit (relative to the workspace, or absolute under it).")
    edits: list[EditOp] = Field(min_length=1, description="Edits applied in order, each to the result of the previous one.")


class MultiEdit(Tool):
    name = "MultiEdit"
    Args = MultiEditArgs
    description = f"""\
Make several replacements in one file at once. {_PATHS}
- Edits are applied in order, each to the result of the previous one, with the same rules as Edit
  (exact, unique match unless replace_all; old_string != new_string).
- Atomic: if any edit fails, none is applied and the file is unchanged.
- To create a file, give an empty old_string in the first edit.
- Protected files ({PROTECTED_HINT}) are read-only."""

    def run(self, args: MultiEditArgs, ctx: ToolContext) -> ToolResult:
        path = ctx.resolve_writable(args.file_path)
        text, new_file, fresh = _load_for_edit(ctx, path, args.edits)
        counts = []
        for index, op in enumerate(args.edits):
            try:
                text, count, _ = apply_edit(text, op, path.rel, new_file=new_file and index == 0)
            except ToolError as exc:
                raise ToolError(f"edit {index + 1} of {len(args.edits)} (edits[{index}]) failed: {exc} No edits were applied.") from None
            counts.append(count)
        _commit_edit(ctx, path, text, fresh, new_file)
        verb = "Created" if new_file else "Edited"
        return ToolResult(
            output=f"{verb} {path.rel}: applied {plural(len(counts), 'edit')} ({plural(sum(counts), 'replacement')}).",
            data={"path": path.rel, "replacements": counts, "created": new_file},
        )
