"""Task hardening on a GPU (issue 26): a bfloat16 kernel that rounds once is judged against a
float32 run of the reference, through a whole FINAL evaluation (trials and the checked timed
calls); a wrong one still fails; a task a trivial answer passes is never paid."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.records import Mode
from kernel_env.runtime.episode import run_solution
from kernel_env.tasks import Task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FUSED = Path(__file__).parents[1] / "candidates" / "precision" / "fused_bf16.py"
BF16_TASK = Task(id="test/fma_bf16", name="fma_bf16", code='''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x * y + x


def get_inputs():
    return [(torch.randn(1 << 22) * 4).bfloat16(), (torch.randn(1 << 22) * 4).bfloat16()]


def get_init_inputs():
    return []
''')
CLAMP_TASK = Task(id="test/clamp_never_clamps", name="clamp", code=BF16_TASK.code.replace(
    "return x * y + x", "return torch.clamp(x, -1e4, 1e4)"))


def _solution(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / f"solution-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "model_new.py").write_text(text)
    return folder


def test_a_bfloat16_kernel_that_rounds_once_is_correct_and_a_wrong_one_is_not(pool, tmp_path):
    eager = BF16_TASK.code
    namespace: dict = {}
    exec(eager, namespace)
    torch.manual_seed(0)
    x, y = (t.cuda() for t in namespace["get_inputs"]())
    fused = (x.float() * y.float() + x.float()).bfloat16()
    outside = ((fused.float() - (x * y + x).float()).abs() > 1e-2 + 1e-2 * (x * y + x).float().abs()).sum().item()
    assert outside > 0, "the task no longer shows the double rounding this test is about"

    _, honest = run_solution(BF16_TASK, _solution(tmp_path, FUSED.read_text()), language="triton", device="cuda",
                             pool=pool, mode=Mode.FINAL)
    assert honest.correct and not honest.violations and honest.reward is not None and honest.reward >= 1, \
        (honest.error, honest.violations, honest.trials)
    _, wrong = run_solution(BF16_TASK, _solution(tmp_path, FUSED.read_text().replace("WRONG = False", "WRONG = True")),
                            language="triton", device="cuda", pool=pool, mode=Mode.FINAL)
    assert not wrong.correct and wrong.reward == -1 and wrong.fault == "candidate", wrong


def test_a_task_an_input_passed_through_passes_is_not_paid(pool, tmp_path):
    copy = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, y):\n        return x\n"
    _, result = run_solution(CLAMP_TASK, _solution(tmp_path, copy), language="triton", device="cuda", pool=pool, mode=Mode.FINAL)
    assert result.fault == "evaluator" and result.reward is None and not result.correct, result
    assert "returning input 0 unchanged" in result.error


def test_outputs_kept_in_host_memory_are_screened_on_the_device_with_the_same_verdict():
    """The judge keeps a trial's outputs in host memory when the device is short; the screen then
    works on the device a chunk at a time and must say what it says of outputs on the device."""
    from kernel_env.evaluators.child import screen

    torch.manual_seed(0)
    trials = [(torch.rand(3, 1 << 20) * 4, torch.rand(3, 1 << 20)) for _ in range(3)]  # (output, input)
    verdicts = []
    for device, where in ((None, "cuda"), (torch.device("cuda"), "cpu")):
        answers = screen.TrivialAnswers(1e-2, 1e-2, device=device)
        for out, x in trials:
            answers.add([out.to(where)], [x.cuda()])
        verdicts.append((answers.passing(), answers.reasons()))
    assert verdicts[0] == verdicts[1] and verdicts[0][1] == []
    relu = screen.TrivialAnswers(1e-2, 1e-2, device=torch.device("cuda"))
    for _, x in trials:  # relu of a positive input is the input: refused as such, screened from the host
        relu.add([x.clone()], [x.cuda()])
    assert any("input 0" in reason for reason in relu.reasons()), relu.reasons()
