"""The precision contract on a GPU (docs/security.md, The precision contract): a float32 matmul in one
Triton kernel is paid when it computes in float32 (``input_precision="ieee"``) and refused when the same
kernel computes in TF32 (Triton's default for float32 ``tl.dot``), though both pass the tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.records import Mode
from kernel_env.runtime.episode import run_solution
from kernel_env.tasks import Task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

KERNEL = Path(__file__).parents[2] / "benchmarks" / "tasks" / "matmul" / "model_new.py"
# Outputs of about 1 (A scaled by 1 / sqrt(K)), so TF32's error (~3e-4) is well within the 1e-2 tolerance.
TASK = Task(id="test/matmul_2048", name="matmul_2048", code='''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(2048, 2048) / 45, torch.randn(2048, 2048)]


def get_init_inputs():
    return []
''')


def _solution(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model_new.py").write_text(text)
    return folder


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_a_float32_matmul_is_paid_in_float32_and_refused_in_tf32(pool, tmp_path, precision):
    source = KERNEL.read_text()
    assert 'input_precision="ieee"' in source, "the kernel this test varies has changed"
    text = source.replace('input_precision="ieee"', f'input_precision="{precision}"')
    _, result = run_solution(TASK, _solution(tmp_path, precision, text), language="triton", device="cuda", pool=pool,
                             mode=Mode.VERIFY)
    first = result.trials[0]
    if precision == "ieee":
        assert result.correct and not result.violations and result.reward >= 1, (result.error, result.trials)
        assert first.float64_error < first.float64_error_limit / 10, first
    else:
        assert not result.correct and result.reward == -1, (result.error, result.trials)
        assert "less precise than the task's dtype" in first.message, first
        assert first.float64_error > first.float64_error_limit, first
