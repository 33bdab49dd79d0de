"""The trusted evaluation on a real GPU: the seed orchestrator's four turns, a side-stream
kernel, a CUDA C++ extension, reward 3 on diag(A) @ B, and a patched timer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_env.episode import Episode, run_solution
from kernel_env.evaluators.records import EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.tasks import Task, resolve_task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HERE = Path(__file__).parent
SOLUTIONS = HERE / "solutions"

# The bundled example at 64M elements: large enough that a kernel's time, not Python's launch
# overhead (which the timed region includes, as in KernelBench), decides the speed-up.
RELU_ADD = Task(id="example/relu_add_64M", source="example",
                code=resolve_task("example/relu_add").code.replace("N = 1 << 24", "N = 1 << 26"))


def _triton_solution(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model_new.py").write_text((SOLUTIONS / f"{name}.py").read_text())
    return directory


def _evaluate(pool, task: Task, solution: Path, language: str = "triton", mode: Mode = Mode.FINAL):
    build, result = run_solution(task, solution, language=language, device="cuda", pool=pool, mode=mode)
    return result


def test_seed_scenario_relu_add_in_four_turns(pool, tmp_path):
    with Episode.open(RELU_ADD, language="triton", device="cuda", pool=pool) as episode:
        turns = {}
        for turn in ("turn1_multiply", "turn2_out_of_bounds", "turn3_two_launches", "turn4_fused"):
            episode.workspace.copy_solution(_triton_solution(tmp_path, turn))
            turns[turn] = episode.evaluate(Mode.FINAL)

    first = turns["turn1_multiply"]
    assert not first.correct and first.error is None and first.reward == -1
    assert "elements outside" in first.trials[0].message

    second = turns["turn2_out_of_bounds"]
    assert not second.correct and second.reward == -1
    assert "illegal memory access" in second.error.lower() or "cuda error" in second.error.lower(), second.error

    third = turns["turn3_two_launches"]  # the job after the CUDA fault, on the same pool
    assert third.correct and third.error is None, third
    assert third.speedup_vs_compile < 1.0, third.summary()

    fourth = turns["turn4_fused"]
    assert fourth.correct, fourth
    assert fourth.speedup_vs_eager >= 1.0 and fourth.reward >= 2, fourth.summary()


def test_side_stream_kernel_is_timed_honestly(pool, tmp_path):
    fused = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "turn4_fused"))
    side = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "side_stream"))
    assert fused.correct and side.correct, side
    # Work launched on another stream is still inside the timed region: no free speed-up.
    assert side.runtime_ms >= 0.8 * fused.runtime_ms, (side.runtime_ms, fused.runtime_ms)


def test_diag_matmul_row_scaling_reaches_reward_3(pool, tmp_path):
    task = Task(id="kernelbench/L1/12", code=(SOLUTIONS / "diag_matmul_task.py").read_text(), source="kernelbench", level=1)
    result = _evaluate(pool, task, _triton_solution(tmp_path, "diag_matmul_rowscale"))
    assert result.correct and result.reward == 3, result.summary()


def test_cuda_extension_example_builds_and_is_fast(pool):
    build, result = run_solution(resolve_task("example/relu_add"), example_dir("relu_add") / "solutions" / "cuda", language="cuda",
                                 device="cuda", pool=pool)
    assert build.ok, build.output
    assert result.correct and result.reward >= 2, result.summary()


def test_patched_cuda_event_timer_is_caught(pool, tmp_path):
    result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "patched_timer"), mode=Mode.PROFILE)
    assert result.reward == -1
    # Refused before it runs (the source rules see the setattr), or, if it ran, reported by the
    # integrity check; either way the forged timer never decides a number.
    assert any("setattr" in v or "torch.cuda.Event.elapsed_time was replaced" in v for v in result.violations), result.violations


def test_torch_fallback_in_cuda_forward_is_a_violation(pool, tmp_path):
    result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "torch_fallback"), mode=Mode.VERIFY)
    assert result.reward == -1
    assert any("torch computes" in v for v in result.violations), result.violations
