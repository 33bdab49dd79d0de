"""Glob and Grep: finding files and text in the workspace.

Glob uses ``Sandbox.glob`` (run inside the sandbox). Grep runs ripgrep inside the sandbox
through ``Sandbox.exec``, in a subshell so the agent's persistent shell (its cwd) is left
as it was; every argument is shell-quoted, so a pattern is never interpreted by the shell.
Where ``rg`` is missing, the same search falls back to ``grep -rE``.
"""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import Field

from kernel_env.tools.base import Tool, ToolArgs, ToolContext, ToolError, ToolResult, plural

MAX_GLOB_RESULTS = 100
_GREP_TIMEOUT_S = 60.0

# File types for the grep fallback (ripgrep knows these and many more itself).
_GREP_TYPES = {
    "c": ("*.c", "*.h"), "cpp": ("*.cpp", "*.cc", "*.cxx", "*.hpp", "*.hh", "*.h", "*.inl"),
    "cuda": ("*.cu", "*.cuh"), "py": ("*.py", "*.pyi"), "python": ("*.py", "*.pyi"),
    "sh": ("*.sh", "*.bash"), "md": ("*.md", "*.markdown"), "markdown": ("*.md", "*.markdown"),
    "json": ("*.json",), "yaml": ("*.yaml", "*.yml"), "toml": ("*.toml",), "txt": ("*.txt",),
    "cmake": ("CMakeLists.txt", "*.cmake"), "make": ("Makefile", "*.mk"),
}

# Types every ripgrep we run must know (added with --type-add; harmless where rg has them).
_RG_EXTRA_TYPES = {"cuda": "*.{cu,cuh}"}


def _display(ctx: ToolContext, sandbox_path: str) -> str:
    root = ctx.workdir.rstrip("/") + "/"
    return sandbox_path[len(root):] if sandbox_path.startswith(root) else sandbox_path


# ---------------------------------------------------------------------- Glob


class GlobArgs(ToolArgs):
    pattern: str = Field(description="The glob pattern, e.g. '**/*.cu' or 'kernels/*_binding.cpp' ('**' matches any depth).")
    path: str | None = Field(None, description="The directory to search in (default: the workspace).")


class Glob(Tool):
    name = "Glob"
    Args = GlobArgs
    description = f"""\
Find files by name with a glob pattern ('*' within a directory, '**' across directories, e.g.
'**/*.cu'), relative to `path` (default: the workspace). Returns matching file paths, newest
first, at most {MAX_GLOB_RESULTS}."""

    def run(self, args: GlobArgs, ctx: ToolContext) -> ToolResult:
        base = ctx.resolve(args.path, what="path") if args.path else ctx.resolve(".")
        pattern = args.pattern.strip()
        if not pattern:
            raise ToolError("the pattern is empty; e.g. '**/*.cu'")
        if pattern.startswith("/"):
            # An absolute pattern is fine if it lies under the search directory.
            prefix = base.sandbox_path.rstrip("/") + "/"
            if not pattern.startswith(prefix):
                raise ToolError(f"the pattern {pattern} is outside the search directory {base.sandbox_path}; use a relative pattern like '**/*.cu'")
            pattern = pattern[len(prefix):]
        if ".." in pattern.split("/"):
            raise ToolError("the pattern must not contain '..'; set `path` to search another directory of the workspace")
        matches = [info for info in ctx.sandbox.glob(pattern, base.sandbox_path) if not info.is_dir]
        matches.sort(key=lambda info: info.mtime, reverse=True)
        shown = [_display(ctx, info.path) for info in matches[:MAX_GLOB_RESULTS]]
        where = "" if base.rel == "." else f" in {base.rel}"
        if not shown:
            return ToolResult(output=f"No files match {args.pattern!r}{where}.", data={"count": 0, "files": []})
        output = "\n".join(shown)
        if len(matches) > len(shown):
            output += f"\n[showing the {len(shown)} newest of {len(matches)} matching files; narrow the pattern to see the rest]"
        return ToolResult(output=output, data={"count": len(matches), "files": shown})


# ---------------------------------------------------------------------- Grep


class GrepArgs(ToolArgs):
    pattern: str = Field(description="The regular expression to search for (ripgrep syntax, e.g. '__global__\\s+void').")
    path: str | None = Field(None, description="The file or directory to search (default: the workspace).")
    glob: str | None = Field(None, description="Only search files matching this glob, e.g. '*.cu' or '*.{cu,cpp}'.")
    file_type: str | None = Field(None, alias="type", description="Only search files of this type, e.g. 'cuda', 'cpp', 'py'.")
    output_mode: Literal["content", "files_with_matches", "count"] = Field(
        "files_with_matches",
        description="'content': matching lines; 'files_with_matches': file paths (default); 'count': matches per file.",
    )
    case_insensitive: bool = Field(False, alias="-i", description="Case-insensitive search.")
    line_numbers: bool = Field(True, alias="-n", description="Show line numbers (content mode).")
    after: int | None = Field(None, alias="-A", ge=0, description="Lines of context after each match (content mode).")
    before: int | None = Field(None, alias="-B", ge=0, description="Lines of context before each match (content mode).")
    context: int | None = Field(None, alias="-C", ge=0, description="Lines of context before and after each match (content mode).")
    multiline: bool = Field(False, description="Let the pattern span lines ('.' matches newlines).")
    head_limit: int | None = Field(None, ge=1, description="Show only the first N lines / files / counts of the output.")


class Grep(Tool):
    name = "Grep"
    Args = GrepArgs
    description = """\
Search file contents with a regular expression (ripgrep). Use it instead of running grep or rg
in Bash.
- Filter files with `glob` (e.g. '*.cu') or `type` (e.g. 'cuda', 'cpp', 'py').
- output_mode: 'files_with_matches' (default) lists files; 'content' shows matching lines (with
  -n line numbers and -A/-B/-C context lines); 'count' shows matches per file.
- Regex syntax is ripgrep's: escape literal braces and parentheses (e.g. 'launch\\(').
  Set multiline for patterns that span lines. head_limit keeps the first N results."""

    def run(self, args: GrepArgs, ctx: ToolContext) -> ToolResult:
        if not args.pattern:
            raise ToolError("the pattern is empty")
        target = ctx.resolve(args.path, what="path") if args.path else None
        target_rel = target.rel if target and target.rel != "." else None
        script = grep_script(args, ctx.workdir, target_rel)
        result = ctx.sandbox.exec(script, timeout=_GREP_TIMEOUT_S, max_output=max(ctx.max_output_chars * 4, 100_000))
        if result.timed_out:
            raise ToolError(f"the search timed out after {_GREP_TIMEOUT_S:g} s; narrow it with path, glob or type")
        found, _, messages = result.output.partition(STDERR_MARKER)
        messages = messages.strip()
        lines = [_strip_dot(line) for line in found.splitlines() if line.strip()]
        if args.output_mode == "count":
            lines = [line for line in lines if not line.endswith(":0")]
        if result.exit_code not in (0, 1) and not lines:
            raise ToolError(f"the search failed: {messages or f'exit code {result.exit_code}'}")
        if not lines:
            where = f" in {target.rel}" if target_rel else ""
            return ToolResult(output=f"No matches for {args.pattern!r}{where}.", data={"matches": 0, "mode": args.output_mode})
        total = len(lines)
        if args.head_limit is not None and total > args.head_limit:
            lines = lines[:args.head_limit]
        output = "\n".join(lines)
        if len(lines) < total:
            output += f"\n[showing the first {len(lines)} of {total} output lines (head_limit)]"
        if args.output_mode == "files_with_matches":
            output = f"Found {plural(total, 'file')}:\n{output}"
        elif args.output_mode == "count":
            matches = sum(int(line.rsplit(":", 1)[1]) for line in lines if line.rsplit(":", 1)[-1].isdigit())
            output += f"\n[{plural(matches, 'match', 'es')} in {plural(len(lines), 'file')}]"
        if result.truncated:
            output += "\n[the search output was cut; narrow the search]"
        if messages:
            output += "\n[warnings: " + " | ".join(messages.splitlines()[:3]) + "]"
        return ToolResult(output=output, data={"mode": args.output_mode, "lines": total, "truncated": result.truncated})


STDERR_MARKER = "@@kernel_env-grep-stderr@@"


def grep_script(args: GrepArgs, workdir: str, target: str | None) -> str:
    """The shell script (for Sandbox.exec) that runs the search from the workspace with rg, or grep.

    Matches go to stdout; the search's own messages follow a marker line, so a warning about
    one unreadable file does not hide the matches.
    """
    rg = ["rg", "--color=never", "--no-heading", "--with-filename", "--max-columns=1000", "--max-columns-preview", "--sort=path"]
    for name, globs in _RG_EXTRA_TYPES.items():  # older ripgrep releases lack these
        rg += ["--type-add", f"{name}:{globs}"]
    grep = ["grep", "-r", "-E", "--color=never", "-H", "-I"]
    if args.output_mode == "files_with_matches":
        rg.append("--files-with-matches")
        grep.append("-l")
    elif args.output_mode == "count":
        rg.append("--count")
        grep.append("-c")
    else:
        if args.line_numbers:
            rg.append("--line-number")
            grep.append("-n")
        for flag, value in (("-A", args.after), ("-B", args.before), ("-C", args.context)):
            if value is not None:
                rg += [flag, str(value)]
                grep += [flag, str(value)]
    if args.case_insensitive:
        rg.append("--ignore-case")
        grep.append("-i")
    if args.multiline:
        rg += ["--multiline", "--multiline-dotall"]
        grep.append("-z")  # the best grep can do: the whole file is one "line"
    if args.glob:
        rg += ["--glob", args.glob]
        grep += [f"--include={g}" for g in _expand_braces(args.glob)]
    grep_ok = True
    if args.file_type:
        rg += ["--type", args.file_type]
        includes = _GREP_TYPES.get(args.file_type)
        grep_ok = includes is not None
        grep += [f"--include={g}" for g in includes or ()]
    rg += ["--regexp", args.pattern]
    grep += ["-e", args.pattern]
    rg += ["--", target] if target else []
    grep += ["--", target or "."]
    if grep_ok:
        fallback = "command " + shlex.join(grep)
    else:
        known = ", ".join(sorted(_GREP_TYPES))
        fallback = f"echo {shlex.quote(f'unknown file type {args.file_type!r}; known types: {known}')} >&2; false"
    marker = shlex.quote(STDERR_MARKER)
    return (
        f"( builtin cd -- {shlex.quote(workdir)} || exit 2\n"
        "__ke_err=$(command mktemp) || exit 2\n"
        f"if command -v rg >/dev/null 2>&1; then command {shlex.join(rg)} 2>\"$__ke_err\"\n"
        f"else {fallback} 2>\"$__ke_err\"; fi\n"
        "__ke_rc=$?\n"
        f"if [ -s \"$__ke_err\" ]; then echo; echo {marker}; command cat -- \"$__ke_err\"; fi\n"
        "command rm -f -- \"$__ke_err\"; exit $__ke_rc )"
    )


def _expand_braces(pattern: str) -> list[str]:
    """'*.{cu,cpp}' -> ['*.cu', '*.cpp'] (one level; grep's --include has no braces)."""
    start = pattern.find("{")
    end = pattern.find("}", start)
    if start < 0 or end < 0:
        return [pattern]
    return [pattern[:start] + option + pattern[end + 1:] for option in pattern[start + 1:end].split(",")]


def _strip_dot(line: str) -> str:
    return line[2:] if line.startswith("./") else line
