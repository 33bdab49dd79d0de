"""Loaders: find tasks in a file, a KernelBench checkout, record files, or the bundled examples.

Loaders read a single ``.py`` file, a KernelBench checkout (``level1/`` … ``level4/``, ids
``kernelbench/L2/12``), and record files (JSONL, JSON, Parquet) in the shapes of the public data
sets (``sources.py``). Loading never executes task code (``validate.py`` does, in a probe).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from kernel_env import config
from kernel_env.resources import data_dir
from kernel_env.tasks.sources import (
    RECORD_SUFFIXES,
    load_record_file,
    load_record_folder,
)
from kernel_env.tasks.task import Task, TaskError


def load_task_file(path: str | Path, *, source: str = "file", task_id: str | None = None) -> Task:
    """The task of one .py file, ``{source}/{stem}`` unless ``task_id`` names it. A file called
    task.py (a task folder's layout, as in examples/) is named after its folder: two task folders
    give two ids, and a run file keyed by id keeps them apart."""
    path = Path(path)
    try:
        code = path.read_text()
    except OSError as exc:
        raise TaskError(f"task {task_id or path}: cannot read {path}: {exc.strerror}") from None
    level = _level_from_path(path)
    stem = path.resolve().parent.name if path.stem == "task" else path.stem
    problem_id, name = _split_problem_name(stem)
    task = Task(id=task_id or f"{source}/{stem}", code=code, source=source, name=name, level=level, problem_id=problem_id)
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
    """Task records, one JSON object a line, in any shape ``sources.py`` reads (KernelBench
    export, KernelBook, CUDA-Agent-Ops-6K, the synthesis output, or plain ``{"id", "name",
    "code"}`` records). For .json, .parquet or a folder of them, use ``load_tasks``."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise TaskError(f"task source {path}: not a .jsonl file (load_tasks reads .json and .parquet records too)")
    return load_record_file(path, source=source)


def load_tasks(spec: str | Path) -> list[Task]:
    """Every task of a source, parsed, never run (docs/tasks.md, Sources).

    Args:
        spec: ``examples``; a .py file; a .jsonl, .json or .parquet file of task records
            (KernelBench export, KernelBook, CUDA-Agent-Ops-6K, synthesis output); a KernelBench
            checkout; or a folder of record files (a data-set snapshot).

    Returns:
        The tasks, in the source's order; their ids are unique within the source.

    Raises:
        TaskError: the source does not exist or is none of these, a record or file cannot be
            read as a task, or two tasks would have one id (the message names it)."""
    spec_str = str(spec)
    if spec_str in ("examples", "example"):
        return [_example_task(p.parent.name) for p in sorted(data_dir("examples").glob("*/task.py"))]
    path = Path(spec).expanduser()
    if not path.exists():
        raise TaskError(f"task source {spec_str}: no such file or folder")
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
    """One task from a spec. A file that exists is read as a file, whatever its path looks like
    (``examples/relu_add/task.py`` is the file ``load_tasks`` reads too), so every path the loaders
    accept resolves the same task.

    Args:
        spec: a .py path, ``example/NAME``, ``kernelbench/L<level>/<id>``, ``SOURCE#ID`` (an id or
            name within any source ``load_tasks`` reads), or a source that holds exactly one task.
        kernelbench_root: the KernelBench checkout for ``kernelbench/...`` specs; None:
            ``$KERNEL_ENV_KERNELBENCH``.

    Returns:
        The task.

    Raises:
        TaskError: the spec names no task, or a source of several (one line saying so, e.g.
            ``task nope.py: no such file``), or no KernelBench checkout is set for a
            ``kernelbench/...`` spec."""
    spec_str = str(spec)
    path = Path(spec_str).expanduser()
    if path.is_file():
        return _only_task(spec_str)
    if spec_str.startswith(("example/", "examples/")):
        return _example_task(spec_str.split("/", 1)[1].removesuffix("/task.py").rstrip("/"))
    match = re.fullmatch(r"kernelbench/L(\d+)/(\w+)", spec_str)
    if match:
        root = kernelbench_root or config.kernelbench_root()
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
    if spec_str not in ("examples", "example") and not path.exists():
        what = "no such file" if path.suffix in (".py", *RECORD_SUFFIXES) else "no such file or folder"
        raise TaskError(f"task {spec_str}: {what} (a task is example/NAME, a .py file, FILE.jsonl#ID or "
                        "kernelbench/L<level>/<id>)")
    return _only_task(spec_str)


def _only_task(spec: str) -> Task:
    """The task of a source that holds exactly one."""
    tasks = load_tasks(spec)
    if len(tasks) != 1:
        raise TaskError(f"task {spec}: the source holds {len(tasks)} tasks; name one (FILE#ID or kernelbench/L<level>/<id>)")
    return tasks[0]


def _example_task(name: str) -> Task:
    path = data_dir("examples") / name / "task.py"
    if not path.is_file():
        known = ", ".join(sorted(p.parent.name for p in data_dir("examples").glob("*/task.py")))
        raise TaskError(f"task example/{name}: no such bundled example (known: {known})")
    return load_task_file(path, source="example", task_id=f"example/{name}")


def _split_problem_name(stem: str) -> tuple[int | None, str]:
    match = re.match(r"(\d+)_(.+)", stem)
    return (int(match.group(1)), match.group(2)) if match else (None, stem)


def _problem_sort_key(path: Path) -> tuple[int, str]:
    problem_id, _ = _split_problem_name(path.stem)
    return (problem_id if problem_id is not None else 1 << 30, path.name)


def _level_from_path(path: Path) -> int | None:
    match = re.fullmatch(r"level(\d+)", path.parent.name)
    return int(match.group(1)) if match else None


