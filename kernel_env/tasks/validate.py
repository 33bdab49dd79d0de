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
from dataclasses import dataclass, field

from kernel_env.config import DEFAULT_ATOL, DEFAULT_RTOL
from kernel_env.tasks.task import Task, TaskError


@dataclass(frozen=True)
class TaskInfo:
    """What the probe learned by running a task: input and output signatures, and its screen
    (``evaluators/child/screen.py``): ``screened`` False when the task was too large to screen on
    the CPU here (each evaluation screens it anyway); ``trivial``: the trivial answers that pass it
    (non-empty only for a task taken with ``allow_trivial``); ``warnings``: inputs its output
    ignores."""

    inputs: list[dict]
    outputs: list[dict]
    init_inputs: list[str]
    screened: bool = False
    trivial: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def validate_task(task: Task, *, timeout: float = 180.0, allow_trivial: bool = False,
                  atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> TaskInfo:
    """Run the task once in a locked-down probe process (no files outside the Python
    installation, no network, no processes; on the CPU) and learn its signatures and screen
    (docs/tasks.md, Screening).

    Args:
        task: the task.
        timeout: seconds the probe may take.
        allow_trivial: take a task the screen refuses (``TaskInfo.trivial`` then says why).
        atol, rtol: the evaluator's tolerance, which the screen's trivial answers are judged at.

    Returns:
        What the probe learned: input and output signatures, whether it screened the task, the
        trivial answers that pass it, warnings.

    Raises:
        TaskError: the task is unusable, in one line naming it: its source does not parse or
            lacks ``Model``, ``get_inputs`` or ``get_init_inputs``; it does not run (or not within
            ``timeout``); or (unless ``allow_trivial``) the screen refuses it: a trivial answer
            passes it, or its output is not finite."""
    task.check_source()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_env.tasks.probe"],
            input=json.dumps({"id": task.id, "code": task.code, "atol": atol, "rtol": rtol}),
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
    screen = report.get("screen") or {}
    if screen.get("refused") and not allow_trivial:
        what = "" if screen["refused"][0].startswith("the reference's output is not finite") else "a trivial answer passes it: "
        raise TaskError(f"task {task.id}: refused, {what}{'; '.join(screen['refused'])} "
                        "(allow_trivial / --allow-trivial takes it anyway)")
    return TaskInfo(inputs=report["inputs"], outputs=report["outputs"], init_inputs=report["init_inputs"],
                    screened=bool(screen), trivial=screen.get("refused", []), warnings=screen.get("warnings", []))


def iter_valid(tasks: Iterable[Task], *, allow_trivial: bool = False) -> Iterator[tuple[Task, TaskInfo | None, str | None]]:
    """Each task with its TaskInfo, or with the reason it is unusable (refused tasks are yielded too, never dropped)."""
    for task in tasks:
        try:
            yield task, validate_task(task, allow_trivial=allow_trivial), None
        except TaskError as exc:
            yield task, None, str(exc)
