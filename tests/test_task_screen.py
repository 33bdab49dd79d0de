"""Task hardening (issue 26): no task that a trivial answer passes, trial inputs that defeat
shortcuts (evaluators/child/screen.py), screened by ``validate_task`` on the CPU and by every
evaluation's reference process."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.child import screen
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.tasks import Task, TaskError, validate_task


def task(forward: str, inputs: str = "[torch.randn(64, 128)]", args: str = "x", extra: str = "") -> Task:
    code = "import torch\nimport torch.nn as nn\n" + extra + "\n" + textwrap.dedent(f"""\

        class Model(nn.Module):
            def forward(self, {args}):
                return {forward}

        def get_inputs():
            return {inputs}

        def get_init_inputs():
            return []
        """)
    return Task(id=f"test/{abs(hash(forward + inputs + extra)):x}", name="t", code=code)


#: Degenerate tasks, each with the reason's words: the issue's softmax-sum, zeros, a constant
#: that is not zero, the input passed through, a loss that is the same for every seed of the
#: same distribution (a constant answer passes when every trial draws from the task's own
#: distribution), and a NaN.
DEGENERATE = {
    "softmax rows sum to one": (task("torch.softmax(x, dim=1).sum(dim=1)"), "the constant 1"),
    "all but zero": (task("x * 1e-6"), "returning zeros"),
    "a clamp that never clamps": (task("torch.clamp(x, -100.0, 100.0)"), "input 0 unchanged"),
    "not finite": (task("torch.log(x - 10.0)"), "not finite"),
    "two outputs, both trivial": (task("(x * 0.0, torch.ones_like(x).sum(dim=0))"), "output 1"),
}

#: Honest tasks that must stay accepted, sparse or small outputs among them.
HONEST = {
    "relu of a shifted input (98 % zeros)": task("torch.relu(x - 2.0)", "[torch.randn(128, 256)]"),
    "relu of positive inputs": task("torch.relu(x)", "[torch.rand(128, 256)]"),
    "a mean-squared error": task("torch.mean((x - y) ** 2)", "[torch.randn(128, 64), torch.randn(128, 64)]", "x, y"),
    "a softmax": task("torch.softmax(x, dim=1)"),
    "an index output": task("torch.argmax(x, dim=1)"),
    "a log of positive inputs": task("torch.log(x)", "[torch.rand(64, 64) + 0.1]"),
}


@pytest.mark.slow  # 5.5 s each: a probe process and the search for trivial answers
@pytest.mark.parametrize("name", DEGENERATE)
def test_a_task_that_a_trivial_answer_passes_is_refused_with_its_reason(name):
    degenerate, says = DEGENERATE[name]
    with pytest.raises(TaskError, match="refused") as refused:
        validate_task(degenerate)
    assert says in str(refused.value), str(refused.value)
    taken = validate_task(degenerate, allow_trivial=True)
    assert taken.screened and taken.trivial


@pytest.mark.parametrize("name", HONEST)
def test_honest_tasks_stay_accepted(name):
    info = validate_task(HONEST[name])
    assert info.screened and not info.trivial and not info.warnings


def test_an_input_the_output_ignores_is_a_warning():
    info = validate_task(task("torch.relu(x)", "[torch.randn(64, 64), torch.randn(64, 64)]", "x, y"))
    assert info.warnings == ["the output does not depend on input 1 (changing it changed nothing)"]


@pytest.mark.slow  # 5.4 s: the search for trivial answers
def test_a_loss_that_is_the_same_for_every_standard_normal_input_is_accepted_thanks_to_the_variants():
    """A mean over many elements hardly moves between seeds of one distribution: with every trial on
    the task's own inputs, the first trial's output replayed would pass. The variants change the
    scale, so it does not."""
    loss = task("torch.mean((x - y) ** 2)", "[torch.randn(4096, 64), torch.randn(4096, 64)]", "x, y")
    assert not validate_task(loss).trivial
    pinned = task("torch.mean((x - y) ** 2)", "[torch.randn(4096, 64), torch.randn(4096, 64)]", "x, y",
                  extra='INPUT_VARIANTS = ("as_is",)')
    with pytest.raises(TaskError, match=r"returning the constant 2(\.\d+)? as the output"):
        validate_task(pinned)


def test_a_task_too_large_for_the_cpu_is_left_to_the_evaluation():
    big = task("x @ x", "[torch.randn(8192, 8192)]")
    info = validate_task(big)
    assert not info.screened


def test_variants_change_only_floating_inputs_in_place_and_keep_a_uniform_draw_in_range():
    for variant in screen.VARIANTS:
        x, index, mask = torch.randn(1000), torch.arange(10), torch.ones(4, dtype=torch.bool)
        varied = screen.vary([x, index, mask, 3], variant, seed=5)
        assert varied[0] is x and varied[1] is index and varied[2] is mask and varied[3] == 3
        assert torch.equal(index, torch.arange(10)) and bool(mask.all())
    x = torch.randn(1000)
    uniform = screen.vary([x.clone()], "uniform", seed=5)[0]
    assert x.min() <= uniform.min() and uniform.max() <= x.max() and not torch.equal(uniform, x)
    assert torch.equal(uniform, screen.vary([x.clone()], "uniform", seed=5)[0])  # the same seed, the same draw
    assert torch.equal(screen.vary([x.clone()], "scaled_up", seed=5)[0], x * 4)
    assert torch.allclose(screen.vary([x.clone()], "shifted", seed=5)[0], x - x.mean() - x.std(), atol=1e-5)
    assert screen.trial_variants(5) == list(screen.VARIANTS)
    assert screen.trial_variants(3, ("as_is", "shifted")) == ["as_is", "shifted", "as_is"]


def test_the_screen_compares_chunk_by_chunk_and_sees_every_element(monkeypatch):
    """A large output is compared in chunks (bounded work memory); a difference in the last chunk counts."""
    monkeypatch.setattr(screen, "_CHUNK", 1000)
    answers = screen.TrivialAnswers(1e-2, 1e-2)
    for seed in range(3):
        out = torch.zeros(10_000)
        out[-1] = 1.0 if seed == 2 else 0.0
        answers.add([out], [])
    assert answers.passing() == [[]]
    assert not answers.reasons()
    flat = screen.TrivialAnswers(1e-2, 1e-2)
    for _ in range(2):
        flat.add([torch.full((10_000,), 3.0)], [])
    assert flat.reasons() == ["returning the constant 3 as the output passes every trial"]


def test_an_input_variants_declaration_that_names_nothing_known_is_refused():
    with pytest.raises(TaskError, match="INPUT_VARIANTS"):
        validate_task(task("x * 2.0", extra='INPUT_VARIANTS = ("gaussian",)'))


# ---------------------------------------------------------------- at evaluation (the reference process)

FAST = EvalSettings.short()
FUSED = Path(__file__).parent / "candidates" / "precision" / "fused_bf16.py"
#: The docs' case: eager rounds x * y to bfloat16 before adding x; on inputs of magnitude ~4 a kernel
#: that rounds once lands outside the tolerance of eager's output for some elements in every seed tried.
BF16_TASK = task("x * y + x", "[(torch.randn(1 << 16) * 4).bfloat16(), (torch.randn(1 << 16) * 4).bfloat16()]", "x, y")


def evaluate_snapshot(tmp_path: Path, the_task: Task, model_new: str, language: str, settings: EvalSettings = FAST):
    folder = tmp_path / f"snapshot-{len(list(tmp_path.iterdir()))}"
    (folder / "kernels").mkdir(parents=True)
    (folder / "model_new.py").write_text(model_new)
    return evaluate(EvalJob(job_id=uuid.uuid4().hex[:12], task_id=the_task.id, task_code=the_task.code, language=language,
                            device="cpu", mode=Mode.VERIFY, snapshot_dir=folder, settings=settings))


RETURNS_X = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"


def test_a_task_a_trivial_answer_passes_is_not_evaluated_and_never_paid(tmp_path):
    """Screened by the reference process of every evaluation, whatever loaded the task: an
    evaluator fault (never a reward), saying why."""
    degenerate, _ = DEGENERATE["a clamp that never clamps"]
    result = evaluate_snapshot(tmp_path, degenerate, RETURNS_X, "cpp")
    assert result.fault == "evaluator" and result.reward is None and not result.correct, result
    assert "the task cannot be evaluated: returning input 0 unchanged as the output passes every trial" in result.error
    taken = evaluate_snapshot(tmp_path, degenerate, RETURNS_X, "cpp", FAST.model_copy(update={"refuse_trivial_tasks": False}))
    assert taken.correct and taken.fault is None, taken.error


def test_an_answer_that_holds_only_for_the_tasks_own_distribution_fails_on_the_varied_trials(tmp_path):
    """x - x.mean(): for 1M standard-normal elements the mean is about 0.001, so returning x passes
    every trial of the task's own inputs at the tolerance; the shifted trial's mean is 1. (The precision
    contract refuses it on the task's own inputs too: its error against a float64 run is 1e-3.)"""
    centre = task("x - x.mean()", "[torch.randn(1 << 20)]", extra="LOWER_PRECISION = True")  # the tolerance alone
    same_inputs = evaluate_snapshot(tmp_path, centre, RETURNS_X, "cpp",
                                    FAST.model_copy(update={"vary_inputs": False, "refuse_trivial_tasks": False}))
    assert same_inputs.correct, "the shortcut should pass when every trial draws from the task's distribution"
    varied = evaluate_snapshot(tmp_path, centre, RETURNS_X, "cpp")
    assert varied.fault == "candidate" and not varied.correct and varied.reward == -1.0, varied
    assert any(not trial.correct for trial in varied.trials), varied.trials
    held = evaluate_snapshot(tmp_path, task("x - x.mean()", "[torch.randn(1 << 20)]"), RETURNS_X, "cpp",
                             FAST.model_copy(update={"vary_inputs": False, "refuse_trivial_tasks": False}))
    assert not held.correct and "less precise than the task's dtype" in held.trials[0].message, held.trials


def test_a_bfloat16_kernel_that_rounds_once_is_judged_against_a_float32_reference(tmp_path):
    honest = evaluate_snapshot(tmp_path, BF16_TASK, FUSED.read_text(), "triton")
    assert honest.correct and honest.reward == 1.0, (honest.error, honest.trials)
    wrong = evaluate_snapshot(tmp_path, BF16_TASK, FUSED.read_text().replace("WRONG = False", "WRONG = True"), "triton")
    assert not wrong.correct and wrong.fault == "candidate", wrong


@pytest.mark.slow  # 5.5 s: the search for trivial answers
def test_a_variant_that_makes_the_reference_raise_falls_back_and_is_a_warning():
    """Inputs in [0, 1) scaled into indices: scaled up by 4, they run out of range (IndexError on the CPU,
    a device-side assert on a GPU). The trial falls back to the task's own inputs; --check says so."""
    gather = task("table[(x * 16).long()]", "[torch.rand(256)]", "x", extra="table = torch.randn(16)")
    info = validate_task(gather)
    assert not info.trivial
    assert any("'scaled_up' makes the reference raise (IndexError)" in w for w in info.warnings), info.warnings
    pinned = task("table[(x * 16).long()]", "[torch.rand(256)]", "x",
                  extra='table = torch.randn(16)\nINPUT_VARIANTS = ("as_is", "scaled_down")')
    assert validate_task(pinned).warnings == []


def test_any_constant_is_found_not_only_the_first_trials_mean():
    """Trial 1 spreads over [0.98, 1.0] (mean 0.99), trial 2 is 1.012 everywhere: 0.99 fails trial 2,
    but 0.995 passes both (every element within 0.01 + 0.01 * |r|)."""
    answers = screen.TrivialAnswers(1e-2, 1e-2)
    answers.add([torch.linspace(0.98, 1.0, 1000)], [])
    answers.add([torch.full((1000,), 1.012)], [])
    (reason,) = answers.reasons()
    assert reason.startswith("returning the constant 0.99") and "passes every trial" in reason, reason


def test_an_answer_that_passes_the_float32_reference_counts_too():
    """bfloat16 ``(x + 100) - 100 - x``: eager's rounding leaves noise up to 0.25 (zeros fail it), the
    float32 run gives zeros, and a candidate matching either reference is correct: zeros pass."""
    x = torch.randn(4096).bfloat16()
    eager = (x + 100) - 100 - x
    assert eager.abs().max() > 0.05
    precise = (((x.float() + 100) - 100) - x.float()).bfloat16()
    answers = screen.TrivialAnswers(1e-2, 1e-2)
    for _ in range(2):
        answers.add([eager], [x], [precise])
    assert answers.reasons() and answers.passing()[0][0] == "zeros"
    eager_only = screen.TrivialAnswers(1e-2, 1e-2)
    for _ in range(2):
        eager_only.add([eager], [x])
    assert "zeros" not in eager_only.passing()[0]


def test_a_variant_that_cannot_reshape_an_input_falls_back_to_the_tasks_own():
    """An expanded input cannot be scaled in place: those trials use the task's own inputs."""
    info = validate_task(task("x * 2.0", "[torch.randn(1, 64).expand(32, 64)]"))
    assert not info.trivial and any("makes the reference raise" in w for w in info.warnings), info.warnings


def test_the_harness_modules_screen_included_are_out_of_a_candidates_reach(tmp_path):
    from kernel_env.evaluators.static_rules import check_sources

    (tmp_path / "kernels").mkdir()
    (tmp_path / "model_new.py").write_text("import screen\nscreen.vary = lambda inputs, variant, seed: inputs\n")
    assert any("harness's own modules" in v for v in check_sources(tmp_path))


def test_the_job_folder_quota_counts_the_trials_outputs(tmp_path, monkeypatch):
    """The candidate writes its five trials' outputs at once: an honest one with outputs far larger
    than the weights and init inputs stays within its quota (floor 0 here, so the quota is 4 x what
    the folder must hold)."""
    from kernel_env.evaluators import harness

    monkeypatch.setattr(harness, "_JOB_FOLDER_FLOOR", 0)
    wide = task("torch.relu(x + y)", "[torch.randn(1 << 16), torch.randn(1 << 16)]", "x, y")
    control = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
    result = evaluate_snapshot(tmp_path, wide, control, "triton")
    assert result.correct, result.error


def test_an_empty_output_is_trivially_passed():
    answers = screen.TrivialAnswers(1e-2, 1e-2)
    for _ in range(2):
        answers.add([torch.empty(0, 8)], [torch.empty(0, 8)])
    assert answers.reasons() == ["returning zeros as the output passes every trial"]


def test_a_task_is_searched_for_trivial_answers_by_its_first_job_only_and_a_refused_one_by_every_job(tmp_path, monkeypatch):
    """The search is the task's, not the job's (0.3 s of a GPU job's reference): a task found
    sound once is not searched again (it is remembered beside the baselines, so by later processes
    too); one that a trivial answer passes is never remembered, so every job of it is refused."""
    from kernel_env.evaluators.child.protocol import RefTrials
    from kernel_env.evaluators.job import Job

    monkeypatch.setenv("KERNEL_ENV_HOME", str(tmp_path / "home"))  # a baselines cache of this test's own
    searched, ask = [], Job.ask

    def recording(self, child, command, *args, **kwargs):
        if isinstance(command, RefTrials):
            searched.append((self.job.task_id, command.screen))
        return ask(self, child, command, *args, **kwargs)

    monkeypatch.setattr(Job, "ask", recording)
    sound = task("torch.relu(x)", "[torch.randn(1 << 10)]")
    degenerate, _ = DEGENERATE["a clamp that never clamps"]
    for _ in range(2):
        assert evaluate_snapshot(tmp_path, sound, RETURNS_X, "cpp").fault == "candidate"  # x is not relu(x)
        refused = evaluate_snapshot(tmp_path, degenerate, RETURNS_X, "cpp")
        assert refused.fault == "evaluator" and "passes every trial" in refused.error
    assert searched == [(sound.id, True), (degenerate.id, True), (sound.id, False), (degenerate.id, True)]


def test_without_the_search_a_task_s_outputs_are_still_checked_to_be_finite():
    skipped = screen.TrivialAnswers(1e-2, 1e-2, search=False)
    for _ in range(3):
        skipped.add([torch.zeros(64)], [torch.randn(64)])
    assert skipped.reasons() == []  # zeros would pass every trial: not looked for
    skipped.add([torch.tensor([1.0, float("nan")])], [torch.randn(2)])
    assert skipped.reasons() == ["the reference's output is not finite (NaN or Inf in trial 4)"]
