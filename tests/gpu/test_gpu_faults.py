"""Bad samples on a real GPU cost only themselves: a CUDA illegal address, a kernel that never
ends and a candidate hanging in Python are each answered as the candidate's fault within their
bound, and an honest job beside them on the shared pool is judged and timed as alone."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.records import EvalJob, EvalSettings, Mode
from kernel_env.resources import example_dir

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 22")
TIGHT = EvalSettings(step_floor_s=5.0, timing_floor_s=5.0, step_multiple=5.0)

ILLEGAL_ADDRESS = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def far_store(out_ptr):
    tl.store(out_ptr + 1099511627776, 1.0)  # 2**40 elements past the output


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        far_store[(1,)](out)
        return out
'''

DEVICE_SPIN = (Path(__file__).parent / "solutions" / "device_spin.py").read_text()

PYTHON_SPIN = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, y):\n        while True:\n            pass\n"


def _job(tmp_path: Path, name: str, code: str, language: str, mode: Mode, settings: EvalSettings) -> EvalJob:
    folder = tmp_path / name
    (folder / "kernels").mkdir(parents=True)
    (folder / "model_new.py").write_text(code)
    return EvalJob(job_id=uuid.uuid4().hex[:12], task_id="gpu/relu_add_4M", task_code=TASK_CODE, language=language,
                   device="cuda", mode=mode, snapshot_dir=folder, settings=settings)


def _control(tmp_path: Path) -> EvalJob:
    code = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
    return _job(tmp_path, f"control-{uuid.uuid4().hex[:6]}", code, "triton", Mode.FINAL, EvalSettings())


@pytest.mark.parametrize(("name", "code", "language", "within_s", "says"), [
    ("illegal_address", ILLEGAL_ADDRESS, "triton", 60, "illegal memory access"),
    ("device_spin", DEVICE_SPIN, "triton", 90, "took longer than"),
], ids=["illegal_address", "device_spin"])
def test_a_device_fault_is_the_candidates_and_the_next_job_is_unaffected(pool, tmp_path, name, code, language,
                                                                      within_s, says):
    began = time.monotonic()
    result = pool.submit(_job(tmp_path, name, code, language, Mode.VERIFY, TIGHT)).result()
    elapsed = time.monotonic() - began
    assert not result.correct and result.fault == "candidate" and result.reward == -1.0, result.summary()
    assert says in (result.error or "").lower(), result.error
    assert elapsed < within_s, f"answered after {elapsed:.0f} s"
    after = pool.submit(_control(tmp_path)).result()
    assert after.correct and after.fault is None, after.summary()


def test_an_honest_job_beside_a_hanging_candidate_is_answered_as_alone(pool, tmp_path):
    alone = pool.submit(_control(tmp_path)).result()  # baselines cached, children warm
    alone = pool.submit(_control(tmp_path)).result()
    assert alone.correct, alone.summary()
    hung = pool.submit(_job(tmp_path, "python_spin", PYTHON_SPIN, "cpp", Mode.VERIFY,
                            EvalSettings(step_floor_s=40.0)))
    time.sleep(5.0)  # into its endless loop
    beside = pool.submit(_control(tmp_path)).result()
    assert not hung.done(), "the hanging candidate ended before the control"
    assert beside.correct and not beside.violations, beside.summary()
    assert beside.steps_s.get("waiting for the device", 0.0) < 3.0, beside.steps_s
    assert beside.duration_s < 3 * alone.duration_s + 2.0, (beside.duration_s, alone.duration_s)
    ended = hung.result()
    assert ended.fault == "candidate" and "took longer than" in (ended.error or ""), ended.error


def test_an_honest_job_beside_a_kernel_that_never_ends_waits_for_it_rather_than_share_the_device(pool, tmp_path):
    """The spinning kernel runs on while its process is frozen: the timing run finds the device
    busy, waits for the spinner's job to end (its bound: ~25 s here), and times alone."""
    assert pool.submit(_control(tmp_path)).result().correct
    spinner = pool.submit(_job(tmp_path, "device_spin", DEVICE_SPIN, "triton", Mode.VERIFY,
                               EvalSettings(step_floor_s=25.0)))
    time.sleep(8.0)  # its kernel compiled and spinning
    beside = pool.submit(_control(tmp_path)).result()
    assert beside.correct and not beside.violations, beside.summary()
    assert "device busy with another job's kernel" in beside.steps_s, beside.steps_s
    assert beside.steps_s["waiting for the device"] > 5.0, beside.steps_s  # for the spinner's job to end
    ended = spinner.result(timeout=30)
    assert ended.fault == "candidate" and "took longer than" in (ended.error or ""), ended.error
