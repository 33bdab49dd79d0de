"""The task record: one KernelBench-format reference operator, and its static checks.

A task is one self-contained Python source defining ``Model(nn.Module)``, ``get_inputs()``
and ``get_init_inputs()``. Nothing here executes task code.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

TASK_SOURCES = ("kernelbench", "ops6k", "kernelbook", "synthetic", "file", "example")
_REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskError(ValueError):
    """A task that cannot be used; the message is one line naming the task."""


@dataclass(frozen=True)
class Task:
    """One reference operator. ``code`` is the whole Python source of the task."""

    id: str
    code: str
    source: str = "file"
    name: str = ""
    level: int | None = None
    problem_id: int | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def hash(self) -> str:
        """Content hash of the code: keys baseline caches and workspace provenance."""
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    def check_source(self) -> None:
        """Static checks (no execution): parses, and defines Model, get_inputs, get_init_inputs."""
        try:
            tree = ast.parse(self.code, filename=f"<task {self.id}>")
        except SyntaxError as exc:
            raise TaskError(f"task {self.id}: syntax error at line {exc.lineno}: {exc.msg}") from None
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        }
        defined |= {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        missing = [name for name in _REQUIRED_NAMES if name not in defined]
        if missing:
            raise TaskError(f"task {self.id}: does not define {', '.join(missing)} (KernelBench format needs Model, get_inputs, get_init_inputs)")

    def to_record(self) -> dict:
        return {
            "id": self.id, "source": self.source, "name": self.name, "level": self.level,
            "problem_id": self.problem_id, "hash": self.hash, "code": self.code, **({"metadata": self.metadata} if self.metadata else {}),
        }
