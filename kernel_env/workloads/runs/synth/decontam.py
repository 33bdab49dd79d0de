"""Decontaminate: drop a synthesised task whose ``Model`` class is structurally too close to an
evaluation task's (AST similarity above a threshold, 0.9 as in the paper).

The structure of a ``Model`` class is its AST in pre-order with names and constants normalised
away: every user-chosen name (arguments, variables, ``self.<attribute>``, helper methods) becomes
``ID`` and every literal ``CONST``; docstrings and type annotations are dropped. What remains is
the shape of the code and the library API it calls (``torch.relu``, ``nn.Conv2d``, ``dim=``).
Two classes' similarity is ``difflib.SequenceMatcher``'s ratio of their token sequences
(2·matches / total length): a copy with renamed variables, other sizes and a new docstring
scores 1.0; a different operator chain scores far lower.

Only parsing happens here; no task code runs.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernel_env.tasks import Task

DEFAULT_THRESHOLD = 0.9
_BUILTINS = frozenset(dir(builtins))
_KEEP_METHODS = frozenset({"__init__", "forward"})


def _model_class(tree: ast.Module) -> ast.ClassDef | None:
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    if "Model" in classes:
        return classes["Model"]
    for node in tree.body:  # ``Model = SomeClass`` (KernelBook rows, for one)
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "Model" for t in node.targets)
                and isinstance(node.value, ast.Name)):
            return classes.get(node.value.id)
    return None


def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _strip(node: ast.AST) -> None:
    """Remove docstrings and annotations in place."""
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if (isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            child.body = body[1:] or [ast.Pass()]
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            child.returns = None
        if isinstance(child, ast.arg):
            child.annotation = None
        if isinstance(child, ast.AnnAssign):
            child.annotation = ast.Constant(value=None)


class _Tokens(ast.NodeVisitor):
    def __init__(self, keep: set[str]):
        self.keep = keep
        self.out: list[str] = []

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.expr_context, ast.Load, ast.Store, ast.Del)):
            return
        kind = type(node).__name__
        if isinstance(node, ast.Name):
            self.out.append(f"Name:{node.id if node.id in self.keep else 'ID'}")
            return
        if isinstance(node, ast.Constant):
            self.out.append("CONST")
            return
        if isinstance(node, ast.Attribute):
            owner_is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            self.out.append(f"Attr:{'ID' if owner_is_self else node.attr}")
        elif isinstance(node, ast.keyword):
            self.out.append(f"kw:{node.arg}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.out.append(f"{kind}:{node.name if node.name in _KEEP_METHODS else 'ID'}")
        elif isinstance(node, ast.arg):
            self.out.append("arg")
            return
        else:
            self.out.append(kind)
        super().generic_visit(node)


def fingerprint(code: str) -> tuple[str, ...] | None:
    """The normalised token sequence of a task's ``Model`` class, or None if the code does not
    parse or has no Model class."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    model = _model_class(tree)
    if model is None:
        return None
    _strip(model)
    visitor = _Tokens(keep=_imported_names(tree) | _BUILTINS | {"self"})
    for statement in model.body:  # the class's own name and decorators are not structure
        visitor.visit(statement)
    return tuple(visitor.out)


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """Structural similarity in [0, 1] of two fingerprints."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@dataclass(frozen=True)
class Match:
    """A task's closest evaluation task and their similarity (0 and None with an empty evaluation set)."""

    task_id: str
    similarity: float
    nearest: str | None

    def to_record(self) -> dict:
        return {"task_id": self.task_id, "similarity": round(self.similarity, 6), "nearest": self.nearest}


class EvalIndex:
    """The fingerprints of an evaluation set, for nearest-neighbour queries."""

    def __init__(self, tasks: Iterable[Task]):
        self.entries: list[tuple[str, tuple[str, ...]]] = []
        self.unparsed: list[str] = []
        for task in tasks:
            tokens = fingerprint(task.code)
            if tokens is None:
                self.unparsed.append(task.id)
            else:
                self.entries.append((task.id, tokens))

    def __len__(self) -> int:
        return len(self.entries)

    def nearest(self, task_id: str, code: str) -> Match:
        """The most similar evaluation task. An unparsable task matches nothing (similarity 0)."""
        tokens = fingerprint(code)
        best, best_id = 0.0, None
        if tokens is None:
            return Match(task_id, 0.0, None)
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(tokens)  # SequenceMatcher caches facts about seq2: keep the query there
        for eval_id, eval_tokens in self.entries:
            matcher.set_seq1(eval_tokens)
            if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
                continue  # upper bounds: this one cannot beat the best so far
            ratio = matcher.ratio()
            if ratio > best:
                best, best_id = ratio, eval_id
        return Match(task_id, best, best_id)


@dataclass(frozen=True)
class DecontamReport:
    """Every task's nearest evaluation task, and which were dropped (similarity > threshold)."""

    matches: list[Match]
    threshold: float

    @property
    def dropped(self) -> list[Match]:
        return [m for m in self.matches if m.similarity > self.threshold]

    def kept_ids(self) -> set[str]:
        return {m.task_id for m in self.matches if m.similarity <= self.threshold}


def decontaminate(tasks: Iterable[Task], eval_tasks: Iterable[Task], *,
                  threshold: float = DEFAULT_THRESHOLD) -> DecontamReport:
    """Match every task against the evaluation set; those above ``threshold`` are dropped."""
    index = EvalIndex(eval_tasks)
    return DecontamReport(matches=[index.nearest(t.id, t.code) for t in tasks], threshold=threshold)


def write_dropped(matches: Iterable[Match], path: Path) -> Path:
    """The dropped tasks as JSON lines: task_id, similarity, nearest evaluation task."""
    path.write_text("".join(json.dumps(m.to_record()) + "\n" for m in matches))
    return path


def write_histogram(similarities: Sequence[float], threshold: float, path: Path, *, title: str = "") -> str | None:
    """Plot the similarity histogram (PNG) with the threshold marked. Returns None when written, or
    a note saying why not (matplotlib is optional; no similarities)."""
    if not similarities:
        return "no similarities to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no similarity histogram (pip install matplotlib)"
    dropped = sum(s > threshold for s in similarities)
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.hist(similarities, bins=[i / 50 for i in range(51)], color="#4878a8", edgecolor="white")
    axes.axvline(threshold, color="#c0392b", linestyle="--", label=f"threshold {threshold:g}: {dropped} dropped")
    axes.set_xlim(0, 1)
    axes.set_xlabel("AST similarity of Model to its nearest evaluation task")
    axes.set_ylabel("tasks")
    axes.yaxis.get_major_locator().set_params(integer=True)
    axes.set_title(title or f"decontamination: {len(similarities)} tasks")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
