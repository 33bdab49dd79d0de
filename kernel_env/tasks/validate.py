"""Validation: run a task once in a locked-down probe process (``probe.py``) and learn its signatures.

The probe refuses file, network and process access, so a malformed or hostile task becomes one
clear line naming it, never a problem of the caller's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kernel_env.tasks.task import Task, TaskError


@dataclass(frozen=True)
class TaskInfo:
    """What the probe learned by running a task: input and output signatures."""

    inputs: list[dict]
    outputs: list[dict]
    init_inputs: list[str]


def validate_task(task: Task, *, timeout: float = 180.0) -> TaskInfo:
    """Run the task once in a locked-down probe process; raise TaskError with one clear line if it is unusable."""
    task.check_source()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_env.tasks.probe"],
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
