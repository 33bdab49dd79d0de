"""What every agent tool is made of: its argument model, its result, and the episode state.

A tool is a small class: ``name``, a ``description`` written for the model, an ``Args``
pydantic model (the OpenAI schema is generated from it, see ``schema.py``) and ``run(args,
ctx)``. Tools are stateless; what an episode remembers between calls (which files were
read and when, the todo list, background jobs) lives in ``ToolContext``.

Tools touch the workspace only through the ``Sandbox`` protocol, whose file operations run
inside the isolation boundary: a tool never opens a workspace path on the host. A tool
reports a problem the agent can fix by raising ``ToolError`` with a short, actionable
message; ``ToolBox.run`` turns it (and ``SandboxError``) into an error result.
"""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kernel_env.sandbox.base import FileInfo, Sandbox
from kernel_env.workspace import AGENT_OWNED, PROTECTED

#: Default cap on the text a single tool call returns to the model.
DEFAULT_MAX_OUTPUT_CHARS = 30_000


class ToolError(Exception):
    """A problem the agent can fix; the message is shown to the model as the tool's output."""


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown arguments are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ToolResult(BaseModel):
    """What one tool call produced.

    ``output`` is the text the model sees; ``is_error`` says the call failed (bad arguments,
    a refused path, a command that timed out is *not* an error: it ran); ``data`` carries
    structured facts for the environment and logs (exit code, path, counts, ...).
    """

    output: str
    is_error: bool = False
    data: dict[str, Any] = Field(default_factory=dict)
    #: The tool that produced this result ("" when the call could not be parsed).
    tool: str = ""
    #: The id of the call this answers, when the model gave one (OpenAI ``tool_call_id``).
    call_id: str | None = None

    @property
    def invalid_call(self) -> bool:
        """The model's call itself was wrong (unparseable, unknown tool, bad arguments), not its effect.

        ``data["error_kind"]`` says which: ``parse``, ``unknown_tool``, ``invalid_arguments``; a call
        that was valid but failed has ``tool_error`` (or ``internal`` for a bug on our side).
        """
        return self.data.get("error_kind") in INVALID_CALL_KINDS


INVALID_CALL_KINDS = frozenset({"parse", "unknown_tool", "invalid_arguments"})


@dataclass
class ReadRecord:
    """The state of a file when the agent last saw its full content (Read, or our own write)."""

    mtime: float
    size: int

    @classmethod
    def of(cls, info: FileInfo) -> ReadRecord:
        return cls(mtime=info.mtime, size=info.size)

    def matches(self, info: FileInfo) -> bool:
        return self.mtime == info.mtime and self.size == info.size


@dataclass
class ToolContext:
    """Everything the tools of one episode share."""

    sandbox: Sandbox
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    #: Sandbox path -> state when last read (read-before-write for Write).
    reads: dict[str, ReadRecord] = field(default_factory=dict)
    #: The agent's todo list (TodoItem models from todo.py).
    todos: list[Any] = field(default_factory=list)
    #: Background job id -> the command it runs.
    background_jobs: dict[str, str] = field(default_factory=dict)

    @property
    def workdir(self) -> str:
        return self.sandbox.workdir.rstrip("/") or "/"

    # ------------------------------------------------------------------ paths

    def resolve(self, raw: str, *, what: str = "path") -> WorkspacePath:
        """Turn the agent's path into a sandbox path under the workspace, or raise ToolError.

        Only the lexical part is checked here (absolute paths elsewhere, ``..`` escapes);
        symlinks are resolved by the sandbox itself, inside, when the file is touched.
        """
        if not isinstance(raw, str) or not raw.strip():
            raise ToolError(f"the {what} is empty; give a path relative to the workspace, e.g. kernels/my_kernel.cu")
        if "\x00" in raw:
            raise ToolError(f"the {what} contains a NUL character")
        raw = raw.strip()
        if raw.startswith("~"):
            raise ToolError(f"{raw}: '~' is not expanded; give a path relative to the workspace {self.workdir}")
        root = self.workdir
        full = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(root, raw))
        if full.startswith("//"):
            full = "/" + full.lstrip("/")
        if full != root and not full.startswith(root.rstrip("/") + "/"):
            if raw.startswith("/"):
                raise ToolError(f"{raw} is outside the workspace {root}; use a path relative to the workspace (e.g. kernels/x.cu) or an absolute path under {root}")
            raise ToolError(f"{raw} leaves the workspace through '..'; only files under {root} can be used")
        rel = "." if full == root else posixpath.relpath(full, root)
        return WorkspacePath(sandbox_path=full, rel=rel)

    def resolve_writable(self, raw: str, *, what: str = "file_path") -> WorkspacePath:
        """Like resolve, and refuse protected files and the workspace root with a message saying where to work."""
        path = self.resolve(raw, what=what)
        if path.rel == ".":
            raise ToolError(f"{raw} is the workspace directory itself, not a file")
        protected = path.protected_name
        if protected:
            what = f"{path.rel} is protected and read-only" if path.rel == protected else f"{path.rel} is protected ({protected}/ is read-only)"
            raise ToolError(f"{what}. Write your code in {OWNED_HINT} instead.")
        return path

    # ------------------------------------------------------------------ read-before-write

    def remember(self, path: WorkspacePath) -> None:
        """Record that the agent now knows ``path``'s full current content."""
        info = self.sandbox.stat(path.sandbox_path)
        if info is not None and not info.is_dir:
            self.reads[path.sandbox_path] = ReadRecord.of(info)


def _shown(name: str) -> str:
    return name if "." in name else name + "/"


#: For messages and tool descriptions: "SKILL.md, binding.cpp, ..., utils/" and "kernels/ and model_new.py".
PROTECTED_HINT = ", ".join(_shown(name) for name in PROTECTED)
OWNED_HINT = " and ".join(_shown(name) for name in AGENT_OWNED)


@dataclass(frozen=True)
class WorkspacePath:
    """A path checked to lie (lexically) inside the workspace."""

    #: Absolute path as the sandbox sees it; what the Sandbox methods get.
    sandbox_path: str
    #: Relative to the workspace, for messages ("." for the workspace itself).
    rel: str

    @property
    def protected_name(self) -> str | None:
        for name in PROTECTED:
            if self.rel == name or self.rel.startswith(name + "/"):
                return name
        return None


class Tool(ABC):
    """One agent tool. Subclasses set ``name``, ``description`` and ``Args`` and implement ``run``."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[ToolArgs]]

    @abstractmethod
    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Do the work. Raise ToolError (or let SandboxError through) for problems the agent can fix."""


# ---------------------------------------------------------------------- output helpers


def truncate_middle(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` around a ``[... N characters truncated ...]`` marker."""
    if limit <= 0 or len(text) <= limit:
        return text, False
    head = limit // 2
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[len(text) - tail:]}", True


def plural(count: int, word: str, suffix: str = "s") -> str:
    return f"{count} {word}{'' if count == 1 else suffix}"
