"""A bad sample costs only itself: a candidate that hangs is ended within a bound derived from
its task, and jobs beside it on the same device are neither held up nor judged otherwise
(evaluators/sharing.py, harness.py ``_Evaluation.bound``; docs/design.md, "A bad sample").

CPU, real children: the hanging candidates are C++-language snapshots whose Python never
reaches a kernel (no build needed), the control is the bundled Triton solution (interpreter)."""

from __future__ import annotations

import re
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from kernel_env.evaluators import harness
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import Episode
from kernel_env.runtime.pool import LocalPool
from kernel_env.tasks import Task

pytestmark = pytest.mark.slow  # hanging candidates, each ended at its bound

TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 10")
#: Tight bounds, so a hang ends in seconds here: floor + 5 x the reference's time for the same work.
FAST = EvalSettings.short(step_floor_s=3.0, timing_floor_s=3.0, step_multiple=5.0)

HANGS = {
    "spins in forward": "def forward(self, x, y):\n    while True:\n        pass",
    "sleeps in forward": "def forward(self, x, y):\n    import time\n    time.sleep(3600)",
    "waits forever in forward": "def forward(self, x, y):\n    import queue\n    queue.Queue().get()",
}


def snapshot(root: Path, name: str, model_new: str) -> Path:
    folder = root / name
    (folder / "kernels").mkdir(parents=True)
    (folder / "model_new.py").write_text(model_new)
    return folder


def hanging(root: Path, kind: str) -> Path:
    if kind == "hangs at import":
        return snapshot(root, "import", "import torch.nn as nn\nwhile True:\n    pass\n")
    body = textwrap.indent(HANGS[kind], "    ")
    return snapshot(root, kind.replace(" ", "_"), f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n{body}\n")


def job(folder: Path, language: str, mode: Mode, settings: EvalSettings) -> EvalJob:
    return EvalJob(job_id=uuid.uuid4().hex[:12], task_id="test/relu_add_1k", task_code=TASK_CODE, language=language,
                   device="cpu", mode=mode, snapshot_dir=folder, settings=settings)


def control(root: Path) -> Path:
    return snapshot(root, "control", (example_dir() / "solutions" / "triton" / "model_new.py").read_text())


@pytest.mark.parametrize("kind", [*HANGS, "hangs at import"])
def test_a_hanging_candidate_is_ended_within_its_task_derived_bound(tmp_path, kind):
    started = time.monotonic()
    result = evaluate(job(hanging(tmp_path, kind), "cpp", Mode.VERIFY, FAST))
    elapsed = time.monotonic() - started
    step = "Load" if kind == "hangs at import" else "ModelNew (trials)"
    assert not result.correct and result.fault == "candidate" and result.reward == -1.0, result
    assert f"{step} took longer than" in (result.error or ""), result.error
    # floor 3 s + 5 x a tiny reference's time: ended in seconds, not at step_timeout_s (300 s)
    assert elapsed < 40, f"answered after {elapsed:.0f} s"


def test_a_hanging_neighbour_holds_up_neither_the_timing_nor_the_verdict_of_a_job_beside_it(tmp_path):
    """On one CPU pool of two slots: a candidate that spins in forward (bound: 40 s), then an
    honest profile beside it. The profile is answered correct and timed long before the hang
    ends: its timing runs froze the spinning process instead of waiting for it. The baselines' cache
    is new, so the device's bandwidth is measured beside the hang too (a timing run like the rest)."""
    hang_settings = FAST.model_copy(update={"step_floor_s": 40.0})
    with LocalPool(["cpu"], jobs_per_cpu=2, baselines=BaselineCache(tmp_path / "baselines")) as pool:
        hung = pool.submit(job(hanging(tmp_path, "spins in forward"), "cpp", Mode.VERIFY, hang_settings))
        time.sleep(3.0)  # into its endless loop
        began = time.monotonic()
        honest = pool.submit(job(control(tmp_path), "triton", Mode.PROFILE, FAST)).result(timeout=120)
        honest_s = time.monotonic() - began
        assert not hung.done(), "the hanging candidate ended before the control did"
        assert honest.correct and honest.reward is not None and not honest.violations, (honest.error, honest.violations)
        assert honest.runtime is not None and honest.eager is not None
        # each timing run waited the grace (1 s) at most: not for the hanging step to end
        assert honest.steps_s.get("waiting for the device", 0.0) < 10, honest.steps_s
        assert pool.leases["cpu"].stragglers >= 1
        assert honest_s < 40, honest_s
        ended = hung.result(timeout=120)
    assert ended.fault == "candidate" and re.search(r"ModelNew \(trials\) took longer than 4\ds", ended.error or ""), ended.error


@pytest.fixture
def past_rules(monkeypatch):
    """The source rules refuse ctypes and os before anything runs; these faults are for run time."""
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])


@pytest.mark.parametrize(("kind", "body", "says"), [
    ("segfault in native code", "import ctypes\n        ctypes.string_at(0)", "killed by SIGSEGV"),
    ("result channel closed", "import os\n        os.closerange(3, 4096)", "the worker process died during"),
    ("floods its output", "while True:\n            print('x' * 4096, flush=True)", "printed more than 16 MiB during"),
    ("fills its job folder", ("import itertools\n        for k in itertools.count():\n"
                              "            open(f'/job/cand/f{k}', 'wb').write(b'x')"), "made more than 10000 files in its job folder"),
    ("fills the disk", ("import itertools\n        for k in itertools.count():\n"
                        "            open(f'/job/cand/big{k}', 'wb').write(bytes(1 << 26))"), "MiB to its job folder (at most 64 MiB)"),
], ids=["segfault", "closed_result_channel", "flood", "many_files", "big_files"])
def test_a_crashing_candidate_is_answered_at_once_as_its_own_fault(tmp_path, past_rules, monkeypatch, kind, body, says):
    monkeypatch.setattr(harness, "_JOB_FOLDER_FLOOR", 64 << 20)  # the disk cases write a few hundred MB, not GBs
    folder = snapshot(tmp_path, "crash", f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                                         f"    def forward(self, x, y):\n        {body}\n")
    started = time.monotonic()
    # A bound well past the 30 s asserted: each is ended by its own fault, not by its step's bound.
    result = evaluate(job(folder, "cpp", Mode.VERIFY, FAST.model_copy(update={"step_floor_s": 120.0})))
    assert time.monotonic() - started < 30
    assert not result.correct and result.fault == "candidate" and result.reward == -1.0, result
    assert says in (result.error or ""), result.error
    control_result = evaluate(job(control(tmp_path), "triton", Mode.VERIFY, FAST))
    assert control_result.correct, control_result.error


def test_what_a_candidate_printed_before_it_failed_reaches_its_result(tmp_path, past_rules):
    """The child's prints go to a pipe the parent drains, keeping the tail: the last lines before
    a failure are in the result, even when the candidate closed its own stdout and stderr after."""
    folder = snapshot(tmp_path, "prints", "import os\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                                          "    def forward(self, x, y):\n"
                                          "        print('early line ' * 10000, flush=True)\n"
                                          "        print('the last words', flush=True)\n"
                                          "        os.close(1)\n        os.close(2)\n"
                                          "        raise RuntimeError('no kernel here')\n")
    started = time.monotonic()
    result = evaluate(job(folder, "cpp", Mode.VERIFY, FAST.model_copy(update={"step_floor_s": 20.0})))
    assert time.monotonic() - started < 30
    assert not result.correct and result.fault == "candidate", result
    assert "no kernel here" in (result.error or ""), result.error
    assert "the last words" in result.log_tail, result.log_tail[-300:]


def test_a_build_that_hangs_is_ended_at_the_build_bound_as_the_candidates_fault(tmp_path):
    """A header that is a FIFO nobody writes: the compiler waits on it forever. The final
    evaluation's clean build ends at ``build_timeout_s``, every process of it with it."""
    task = Task(id="test/relu_add_1k", name="relu_add_1k", code=TASK_CODE)
    settings = FAST.model_copy(update={"build_timeout_s": 10.0})
    with Episode.open(task, language="cpp", device="cpu", settings=settings, root=tmp_path) as episode:
        episode.workspace.copy_solution(example_dir() / "solutions" / "cpp")
        made = episode.sandbox.exec("mkfifo kernels/stalls.h && for f in kernels/*.cpp; do sed -i '1i #include \"stalls.h\"' $f; done",
                                    timeout=30)
        assert made.ok, made.output
        started = time.monotonic()
        build, result = episode.build_and_evaluate(Mode.VERIFY, clean=True)
        elapsed = time.monotonic() - started
        assert build.timed_out, build.output[-500:]
        assert not result.compiled and result.fault == "candidate" and result.reward == -1.0, result
        assert "took longer than 10s" in (result.error or ""), result.error
        assert elapsed < 30, elapsed
        # nothing of the build lives on: the sandbox's next command runs at once
        left = episode.sandbox.exec("ps -eo pid,ppid,pgid,sid,comm", timeout=10).output
        assert "cc1plus" not in left, left
