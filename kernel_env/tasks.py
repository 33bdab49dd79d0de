"""Tasks: KernelBench-format reference operators and the loaders that find them.

A task is one self-contained Python source defining ``Model(nn.Module)``, ``get_inputs()``
and ``get_init_inputs()``. Loaders read a single file, a KernelBench checkout
(``level1/`` … ``level4/``, ids ``kernelbench/L2/12``), and record files (JSONL, JSON,
Parquet) in the shapes of the public data sets, parsed in ``kernel_env.task_sources``.

Loading never executes task code. ``validate_task`` does, but only in a separate probe
process (``kernel_env._task_probe``) that refuses file, network and process access, so
a malformed or hostile task becomes one clear line naming it.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kernel_env.resources import data_dir

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


@dataclass(frozen=True)
class TaskInfo:
    """What the probe learned by running a task: input and output signatures."""

    inputs: list[dict]
    outputs: list[dict]
    init_inputs: list[str]


# --------------------------------------------------------------------------- loaders


def load_task_file(path: str | Path, *, source: str = "file", task_id: str | None = None) -> Task:
    path = Path(path)
    try:
        code = path.read_text()
    except OSError as exc:
        raise TaskError(f"task {task_id or path}: cannot read {path}: {exc.strerror}") from None
    level = _level_from_path(path)
    problem_id, name = _split_problem_name(path.stem)
    task = Task(id=task_id or f"{source}/{path.stem}", code=code, source=source, name=name, level=level, problem_id=problem_id)
    task.check_source()
    return task


def load_kernelbench(root: str | Path, levels: Iterable[int] | None = None) -> list[Task]:
    """All problems of a KernelBench checkout (the folder holding level1/ … or its KernelBench/ child)."""
    root = Path(root)
    if not any(root.glob("level[0-9]*")) and (root / "KernelBench").is_dir():
        root = root / "KernelBench"
    level_dirs = sorted(root.glob("level[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    if not level_dirs:
        raise TaskError(f"task source {root}: no level1/ … folders; is this a KernelBench checkout?")
    tasks = []
    for level_dir in level_dirs:
        level = int(re.sub(r"\D", "", level_dir.name))
        if levels is not None and level not in levels:
            continue
        for path in sorted(level_dir.glob("*.py"), key=_problem_sort_key):
            problem_id, _ = _split_problem_name(path.stem)
            suffix = problem_id if problem_id is not None else path.stem
            tasks.append(load_task_file(path, source="kernelbench", task_id=f"kernelbench/L{level}/{suffix}"))
    return tasks


def load_jsonl(path: str | Path, *, source: str | None = None) -> list[Task]:
    """Task records, one JSON object a line, in any shape ``kernel_env.task_sources`` reads
    (KernelBench export, KernelBook, CUDA-Agent-Ops-6K, the synthesis output, or plain
    ``{"id", "name", "code"}`` records)."""
    from kernel_env.task_sources import load_record_file

    return load_record_file(path, source=source)


def load_tasks(spec: str | Path) -> list[Task]:
    """Every task of a source: ``examples``; a .py file; a .jsonl, .json or .parquet file of task
    records (KernelBench export, KernelBook, CUDA-Agent-Ops-6K, synthesis output); a KernelBench
    checkout; or a folder of record files (a data-set snapshot). Ids are unique within a source:
    a source that would give two tasks one id is refused, naming the id."""
    from kernel_env.task_sources import RECORD_SUFFIXES, load_record_file, load_record_folder

    spec_str = str(spec)
    if spec_str in ("examples", "example"):
        return [_example_task(p.parent.name) for p in sorted(data_dir("examples").glob("*/task.py"))]
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".py":
        return [load_task_file(path)]
    if path.is_file() and path.suffix in RECORD_SUFFIXES:
        tasks = load_record_file(path)
    elif path.is_dir() and (any(path.glob("level[0-9]*")) or (path / "KernelBench").is_dir()):
        tasks = load_kernelbench(path)
    elif path.is_dir():
        tasks = load_record_folder(path)
    else:
        raise TaskError(f"task source {spec_str}: not a .py file, a .jsonl file, a KernelBench folder or 'examples' "
                        "(nor a .json or .parquet file of task records, or a folder of them)")
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"task source {spec_str}: two tasks have the id {task.id}; ids must be unique within a source")
        seen.add(task.id)
    return tasks


def resolve_task(spec: str | Path, *, kernelbench_root: str | Path | None = None) -> Task:
    """One task from a spec: a .py path, ``example/relu_add``, ``kernelbench/L2/12``, or ``FILE.jsonl#ID``."""
    spec_str = str(spec)
    if spec_str.startswith(("example/", "examples/")):
        return _example_task(spec_str.split("/", 1)[1])
    match = re.fullmatch(r"kernelbench/L(\d+)/(\w+)", spec_str)
    if match:
        root = kernelbench_root or os.environ.get("KERNEL_ENV_KERNELBENCH")
        if not root:
            raise TaskError(f"task {spec_str}: set KERNEL_ENV_KERNELBENCH (or pass --kernelbench) to a KernelBench checkout")
        level = int(match.group(1))
        for task in load_kernelbench(root, levels=[level]):
            if task.id == spec_str:
                return task
        raise TaskError(f"task {spec_str}: no such problem in {root}")
    if "#" in spec_str:
        file_part, wanted = spec_str.rsplit("#", 1)
        for task in load_tasks(file_part):
            if wanted in (task.id, task.name):
                return task
        raise TaskError(f"task {spec_str}: no task with id or name {wanted!r} in {file_part}")
    tasks = load_tasks(spec_str)
    if len(tasks) != 1:
        raise TaskError(f"task {spec_str}: the source holds {len(tasks)} tasks; name one (FILE#ID or kernelbench/L<level>/<id>)")
    return tasks[0]


def _example_task(name: str) -> Task:
    path = data_dir("examples") / name / "task.py"
    if not path.is_file():
        known = ", ".join(sorted(p.parent.name for p in data_dir("examples").glob("*/task.py")))
        raise TaskError(f"task example/{name}: no such bundled example (known: {known})")
    task = load_task_file(path, source="example", task_id=f"example/{name}")
    return dataclasses.replace(task, name=name)  # the folder names an example; every file is task.py


def _split_problem_name(stem: str) -> tuple[int | None, str]:
    match = re.match(r"(\d+)_(.+)", stem)
    return (int(match.group(1)), match.group(2)) if match else (None, stem)


def _problem_sort_key(path: Path) -> tuple[int, str]:
    problem_id, _ = _split_problem_name(path.stem)
    return (problem_id if problem_id is not None else 1 << 30, path.name)


def _level_from_path(path: Path) -> int | None:
    match = re.fullmatch(r"level(\d+)", path.parent.name)
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------- validation


def validate_task(task: Task, *, timeout: float = 180.0) -> TaskInfo:
    """Run the task once in a locked-down probe process; raise TaskError with one clear line if it is unusable."""
    task.check_source()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_env._task_probe"],
            input=json.dumps({"id": task.id, "code": task.code}),
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"},
        )
    except subprocess.TimeoutExpired:
        raise TaskError(f"task {task.id}: running Model/get_inputs took longer than {timeout:.0f}s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TaskError(f"task {task.id}: the probe process died (exit {proc.returncode}): {tail}")
    report = json.loads(lines[-1])
    if not report["ok"]:
        raise TaskError(f"task {task.id}: {report['error']}")
    return TaskInfo(inputs=report["inputs"], outputs=report["outputs"], init_inputs=report["init_inputs"])


def iter_valid(tasks: Iterable[Task]) -> Iterator[tuple[Task, TaskInfo | None, str | None]]:
    for task in tasks:
        try:
            yield task, validate_task(task), None
        except TaskError as exc:
            yield task, None, str(exc)
