"""Task sources as the commands take them: load one, filter it by the shared options, name one task.

The loaders live in ``kernel_env.tasks``; here their errors become exit codes (an unusable
source is a usage error, a malformed task in it means the task failed), and ``--level``,
``--name``, ``--sample`` and ``--count`` are applied in one way for every command.
"""

from __future__ import annotations

import random
from pathlib import Path

from kernel_env.cli.common import EXIT_TASK_FAILED, EXIT_USAGE, fail
from kernel_env.tasks import Task, TaskError, load_tasks, resolve_task

_EXAMPLES = ("examples", "example")


def load_source(source: str) -> list[Task]:
    """The tasks of ``source`` ('examples', a file, a KernelBench checkout, a folder of record files)."""
    if source not in _EXAMPLES and not Path(source).expanduser().exists():
        fail(f"task source {source}: no such file or folder (give 'examples', a .py, a .jsonl/.json/.parquet, "
             "a KernelBench checkout or a folder of record files)")
    try:
        return load_tasks(source)
    except TaskError as exc:
        # The source itself is unusable (a usage error), or one of its tasks is malformed (the task failed).
        fail(str(exc), EXIT_USAGE if str(exc).startswith("task source ") else EXIT_TASK_FAILED)
    except OSError as exc:
        fail(f"task source {source}: {exc.strerror or exc}")


def source_or_task(source: str) -> list[Task]:
    """The tasks of a source (as ``load_source`` reads it), or the one task a spec names (example/relu_add)."""
    if source in _EXAMPLES or Path(source).expanduser().exists():
        return load_source(source)
    try:
        return [resolve_task(source)]
    except TaskError as exc:
        fail(f"{exc}; or one task's id, such as example/relu_add")


def resolve(task: str, kernelbench: Path | None) -> Task:
    """The one task ``task`` names (example/relu_add, a .py, FILE.jsonl#ID, kernelbench/L<level>/<id>)."""
    try:
        return resolve_task(task, kernelbench_root=kernelbench)
    except TaskError as exc:
        fail(str(exc))


def select(found: list[Task], *, level: int | None = None, name: str | None = None, sample: int | None = None,
           seed: int = 0, count: int | None = None) -> list[Task]:
    """The tasks the filter options keep, in the source's order: level, then name, then a seeded
    random sample, then the first ``count``."""
    selected = [t for t in found if level is None or t.level == level]
    if name:
        needle = name.lower()
        selected = [t for t in selected if needle in t.name.lower() or needle in t.id.lower()]
    if sample is not None and sample < len(selected):
        chosen = set(random.Random(seed).sample(range(len(selected)), sample))
        selected = [t for i, t in enumerate(selected) if i in chosen]  # keep the source's order
    return selected[:count] if count is not None else selected
