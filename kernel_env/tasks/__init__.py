"""Tasks: KernelBench-format reference operators, where they come from, and whether they can be served.

- ``task.py``: the ``Task`` record and its static checks (no execution).
- ``sources.py``: record files (JSONL, JSON, Parquet) in the public data sets' shapes.
- ``loaders.py``: a file, a KernelBench checkout, record files or folders, the bundled examples.
- ``validate.py``: running a task once in the locked-down probe process (``probe.py``).

The modules import downwards only (task ← sources ← loaders; task ← validate).
"""

from __future__ import annotations

from kernel_env.tasks.loaders import (
           load_jsonl,
           load_kernelbench,
           load_task_file,
           load_tasks,
           resolve_task,
)
from kernel_env.tasks.task import TASK_SOURCES, Task, TaskError
from kernel_env.tasks.validate import TaskInfo, iter_valid, validate_task

__all__ = ["TASK_SOURCES", "Task", "TaskError", "TaskInfo", "iter_valid", "load_jsonl", "load_kernelbench",
           "load_task_file", "load_tasks", "resolve_task", "validate_task"]
