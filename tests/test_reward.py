"""The reward (evaluators/reward.py) and the output comparison (evaluators/child/compare.py): pure
functions, tested exhaustively.

Milestone reward, CUDA Agent eq. (1): -1 if incorrect; 3 if more than 5 % faster than both eager
and torch.compile; 2 if more than 5 % faster than eager only; 1 otherwise, where "more than 5 %
faster" is b(t, t0) = (t0 - t) / t0 > 0.05. The boundary values below are exactly representable
(95 / 100 is exactly 5 %), so "exactly 5 %" really is exactly 5 %.

Comparison: the KernelBench rule with no loopholes: same structure, shape and dtype; every element
within atol + rtol * |ref|; NaN or Inf only where the reference has the very same value; integers
and booleans exact; the report names the first bad index and the maximum errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernel_env.evaluators.child.compare import compare_outputs
from kernel_env.evaluators.records import EvalResult, Mode, Timing
from kernel_env.evaluators.reward import (
    RewardKind,
    faster,
    milestone_reward,
    paid_reward,
    speedup_reward,
)

NAN, INF = float("nan"), float("inf")

# --------------------------------------------------------------------------- b(t, t0)


@pytest.mark.parametrize(
    ("time_ms", "baseline_ms", "expected"),
    [
        (95.0, 100.0, False),       # exactly 5 % faster: not "more than" 5 %
        (19.0, 20.0, False),        # exactly 5 % again (1/20)
        (94.999, 100.0, True),      # just more than 5 %
        (95.001, 100.0, False),     # just less than 5 %
        (50.0, 100.0, True),
        (100.0, 100.0, False),      # equal
        (120.0, 100.0, False),      # slower
        (95 / 1024, 100 / 1024, False),  # sub-millisecond (exact binary fractions): the same rule at any scale
        (94 / 1024, 100 / 1024, True),
    ],
)
def test_faster_is_strictly_more_than_the_margin(time_ms, baseline_ms, expected):
    assert faster(time_ms, baseline_ms) is expected


@pytest.mark.parametrize(
    ("time_ms", "baseline_ms"),
    [
        (None, 100.0), (50.0, None), (None, None),               # not measured
        (NAN, 100.0), (50.0, NAN), (NAN, NAN),                   # NaN
        (INF, 100.0), (50.0, INF), (-INF, 100.0), (50.0, -INF),  # infinities
        (50.0, 0.0), (0.0, 0.0), (50.0, -100.0), (-50.0, -100.0),  # zero / negative baseline
    ],
)
def test_unmeasured_or_nonsense_times_are_never_faster(time_ms, baseline_ms):
    assert faster(time_ms, baseline_ms) is False


@pytest.mark.parametrize("time_ms", [0.0, -0.0, -1.0, -1e9])
def test_a_zero_or_negative_runtime_is_not_faster(time_ms):
    assert faster(time_ms, 100.0) is False


def test_margin_is_a_parameter():
    assert faster(90.0, 100.0, margin=0.05) is True
    assert faster(90.0, 100.0, margin=0.10) is False   # exactly 10 %
    assert faster(89.0, 100.0, margin=0.10) is True
    assert faster(99.0, 100.0, margin=0.0) is True
    assert faster(100.0, 100.0, margin=0.0) is False


# --------------------------------------------------------------------------- milestone reward


@pytest.mark.parametrize(
    ("runtime", "eager", "compiled", "expected"),
    [
        (94.0, 100.0, 100.0, 3),     # > 5 % faster than both
        (95.0, 100.0, 100.0, 1),     # exactly 5 % faster than both: neither counts
        (94.0, 100.0, 95.0, 2),      # > 5 % faster than eager, < 5 % faster than compile
        (94.0, 100.0, 98.9473, 2),   # compile: (98.9473 - 94) / 98.9473 < 5 %
        (94.0, 100.0, 99.0, 3),      # compile: (99 - 94) / 99 > 5 %
        (94.0, 100.0, 50.0, 2),      # compile much faster than the candidate
        (94.0, 95.0, 50.0, 1),       # faster than neither by more than 5 %
        (40.0, 95.0, 50.0, 3),
        (60.0, 100.0, 70.0, 3),
        (80.0, 70.0, 100.0, 1),      # > 5 % faster than compile only: still 1 (eq. 1 has no such milestone)
        (100.0, 100.0, 100.0, 1),    # as fast as both
        (200.0, 100.0, 100.0, 1),    # slower than both: correct still earns 1
    ],
)
def test_milestones(runtime, eager, compiled, expected):
    got = milestone_reward(True, runtime, eager, compiled)
    assert got == expected and isinstance(got, int)


@pytest.mark.parametrize(
    ("runtime", "eager", "compiled"),
    [(1.0, 100.0, 100.0), (None, None, None), (NAN, 1.0, 1.0), (1.0, None, None), (0.0, 1.0, 1.0)],
)
def test_incorrect_is_minus_one_whatever_the_times(runtime, eager, compiled):
    assert milestone_reward(False, runtime, eager, compiled) == -1


@pytest.mark.parametrize(
    ("runtime", "eager", "compiled", "expected"),
    [
        (None, None, None, 1),      # verified, not timed
        (None, 100.0, 100.0, 1),    # runtime missing
        (50.0, None, None, 1),      # no baselines
        (50.0, None, 100.0, 1),     # no eager time: never 3 (3 needs both)
        (50.0, 100.0, None, 2),     # no compile time: at most 2
        (NAN, 100.0, 100.0, 1),
        (INF, 100.0, 100.0, 1),
        (50.0, NAN, 100.0, 1),
        (50.0, 100.0, NAN, 2),
        (50.0, 100.0, INF, 2),
        (50.0, 0.0, 0.0, 1),        # zero baselines
        (50.0, 100.0, 0.0, 2),
        (50.0, -100.0, -100.0, 1),  # negative baselines
    ],
)
def test_missing_and_nonsense_times_never_raise_the_milestone(runtime, eager, compiled, expected):
    assert milestone_reward(True, runtime, eager, compiled) == expected


def test_milestone_margin_is_configurable():
    assert milestone_reward(True, 90.0, 100.0, 100.0, margin=0.05) == 3
    assert milestone_reward(True, 90.0, 100.0, 100.0, margin=0.10) == 1
    assert milestone_reward(True, 90.0, 100.0, 95.0, margin=0.02) == 3


# --------------------------------------------------------------------------- speed-up reward


@pytest.mark.parametrize(
    ("correct", "runtime", "compiled", "expected"),
    [
        (False, 1.0, 2.0, -1.0),
        (False, None, None, -1.0),
        (True, 1.0, 2.0, 2.0),
        (True, 4.0, 2.0, 0.5),
        (True, 2.0, 2.0, 1.0),
        (True, None, 2.0, 0.0),   # not timed
        (True, 1.0, None, 0.0),   # no compile baseline
        (True, 0.0, 2.0, 0.0),    # a zero runtime is not a measurement
        (True, 1.0, 0.0, 0.0),
    ],
)
def test_speedup_reward(correct, runtime, compiled, expected):
    got = speedup_reward(correct, runtime, compiled)
    assert got == pytest.approx(expected) and isinstance(got, float)
    result = _result(correct=correct, runtime=runtime, compiled=compiled, reward=3.0)
    assert paid_reward(result, RewardKind.SPEEDUP) == pytest.approx(expected)
    assert paid_reward(result, "speedup") == pytest.approx(expected)


@pytest.mark.parametrize(("runtime", "compiled"), [(NAN, 1.0), (1.0, NAN), (1.0, INF), (-1.0, 1.0), (1.0, -1.0)])
def test_speedup_reward_of_nonsense_times_is_a_plain_finite_non_negative_number(runtime, compiled):
    got = speedup_reward(True, runtime, compiled)
    assert math.isfinite(got) and got >= 0.0


def _result(*, correct: bool, runtime: float | None = None, eager: float | None = None, compiled: float | None = None,
            reward: float | None = None) -> EvalResult:
    def timing(ms):
        return None if ms is None else Timing(median_ms=ms, min_ms=ms, max_ms=ms, calls=10)
    return EvalResult(job_id="j", task_id="t", language="cpp", device="cpu", mode=Mode.FINAL, correct=correct,
                      runtime=timing(runtime), eager=timing(eager), compiled_baseline=timing(compiled), reward=reward)


def test_the_paid_milestone_is_the_one_the_harness_recorded_never_recomputed():
    # Times that would give 3 at the default margin: the recorded milestone (judged with another
    # margin, say) is what is paid.
    result = _result(correct=True, runtime=1.0, eager=100.0, compiled=100.0, reward=1.0)
    assert paid_reward(result) == 1.0 and isinstance(paid_reward(result), float)
    assert paid_reward(result, "milestone") == 1.0
    assert paid_reward(_result(correct=True, runtime=1.0, eager=100.0, compiled=100.0)) == -1.0  # never concluded
    with pytest.raises(ValueError):
        paid_reward(result, "fastest")


def test_eval_result_speedups_follow_the_median_times():
    result = EvalResult(job_id="j", task_id="t", language="cpp", device="cpu", mode=Mode.PROFILE, correct=True,
                        runtime=Timing(median_ms=2.0, min_ms=1.0, max_ms=3.0, calls=10),
                        eager=Timing(median_ms=4.0, min_ms=4.0, max_ms=4.0, calls=10),
                        compiled_baseline=Timing(median_ms=3.0, min_ms=3.0, max_ms=3.0, calls=10))
    assert result.speedup_vs_eager == pytest.approx(2.0)
    assert result.speedup_vs_compile == pytest.approx(1.5)
    summary = result.summary()
    assert summary["runtime_ms"] == 2.0 and summary["eager_ms"] == 4.0 and summary["compile_ms"] == 3.0
    untimed = EvalResult(job_id="j", task_id="t", language="cpp", device="cpu", mode=Mode.VERIFY)
    assert untimed.summary()["speedup_vs_eager"] is None and untimed.summary()["speedup_vs_compile"] is None


# --------------------------------------------------------------------------- compare_outputs

ATOL = RTOL = 1e-2


def t(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def test_identical_outputs_pass_with_zero_error():
    ref = torch.randn(4, 5)
    report = compare_outputs(0, ref, ref.clone(), ATOL, RTOL)
    assert report.correct and report.first_bad_index is None and report.message == ""


def test_tolerance_is_atol_plus_rtol_times_abs_ref_inclusive():
    # 1/64 and 1/32 are exact in binary: atol + rtol * |1| = 1/32 exactly.
    atol = rtol = 1 / 64
    assert compare_outputs(0, t(1.0), t(1.0 + 1 / 32), atol, rtol).correct
    assert compare_outputs(0, t(1.0), t(1.0 - 1 / 32), atol, rtol).correct
    assert not compare_outputs(0, t(1.0), t(1.0 + 1 / 32 + 2 ** -20), atol, rtol).correct
    # rtol scales with the reference, not the candidate
    assert compare_outputs(0, t(64.0), t(65.0 + 1 / 64), atol, rtol).correct
    assert not compare_outputs(0, t(0.0), t(1 / 32), atol, rtol).correct   # |ref| = 0: only atol


def test_default_tolerance_example():
    ref = t(0.0, 1.0, 100.0)
    assert compare_outputs(0, ref, ref + t(0.0099, 0.0199, 1.0099), ATOL, RTOL).correct
    report = compare_outputs(0, ref, ref + t(0.0, 0.0, 1.02), ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [2]


def test_nan_never_passes_where_the_reference_is_finite():
    ref = torch.arange(8, dtype=torch.float32)
    cand = ref.clone()
    cand[5] = NAN
    report = compare_outputs(0, ref, cand, ATOL, RTOL)
    assert not report.correct
    assert report.first_bad_index == [5]
    assert "1 NaN where the reference is not NaN" in report.message
    assert "first bad index [5]" in report.message and "got nan" in report.message


def test_all_nan_candidate_fails_everywhere():
    ref = torch.randn(64)
    report = compare_outputs(0, ref, torch.full_like(ref, NAN), ATOL, RTOL)
    assert not report.correct and "64 of 64 elements" in report.message and "64 NaN" in report.message


def test_nan_matches_nan_in_the_same_place():
    ref = t(1.0, NAN, 3.0)
    assert compare_outputs(0, ref, t(1.0, NAN, 3.0), ATOL, RTOL).correct
    # NaN in a different place: fails at both places
    report = compare_outputs(0, ref, t(NAN, 2.0, 3.0), ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [0] and "2 of 3 elements" in report.message


def test_finite_candidate_where_the_reference_is_nan_fails():
    report = compare_outputs(0, t(1.0, NAN), t(1.0, 0.0), ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [1]


@pytest.mark.parametrize(
    ("ref", "cand", "ok"),
    [
        ((1.0, INF), (1.0, INF), True),
        ((-INF, 1.0), (-INF, 1.0), True),
        ((1.0, INF), (1.0, -INF), False),   # wrong sign
        ((1.0, INF), (1.0, 3.4e38), False),  # huge but finite is not inf
        ((1.0, 3.4e38), (1.0, INF), False),  # inf where finite
        ((1.0, INF), (1.0, NAN), False),     # NaN where inf
        ((1.0, NAN), (1.0, INF), False),     # inf where NaN
    ],
)
def test_infinities_only_match_themselves(ref, cand, ok):
    report = compare_outputs(0, t(*ref), t(*cand), ATOL, RTOL)
    assert report.correct is ok
    if not ok:
        assert report.first_bad_index == [1]


def test_shape_mismatch_is_reported_with_both_shapes():
    report = compare_outputs(2, torch.zeros(16), torch.zeros(4, 4), ATOL, RTOL)
    assert not report.correct and report.trial == 2
    assert report.message == "output has shape (4, 4), expected (16,)"
    # same numel, broadcastable, or a 0-d scalar: still a mismatch
    assert not compare_outputs(0, torch.zeros(4, 1), torch.zeros(4), ATOL, RTOL).correct
    assert not compare_outputs(0, torch.zeros(()), torch.zeros(1), ATOL, RTOL).correct


@pytest.mark.parametrize(
    ("ref_dtype", "cand_dtype"),
    [(torch.float32, torch.float64), (torch.float32, torch.float16), (torch.float32, torch.bfloat16),
     (torch.int64, torch.int32), (torch.float32, torch.int32), (torch.bool, torch.uint8)],
)
def test_dtype_mismatch_is_reported(ref_dtype, cand_dtype):
    report = compare_outputs(0, torch.ones(3, dtype=ref_dtype), torch.ones(3, dtype=cand_dtype), ATOL, RTOL)
    assert not report.correct
    assert report.message == f"output has dtype {cand_dtype}, expected {ref_dtype}"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_outputs_must_match_exactly(dtype):
    ref = torch.arange(10, dtype=dtype)
    assert compare_outputs(0, ref, ref.clone(), ATOL, RTOL).correct
    cand = ref.clone()
    cand[7] += 1  # off by one: within atol=1e-2? no: integers are exact
    report = compare_outputs(0, ref, cand, 10.0, 10.0)  # even with absurd tolerances
    assert not report.correct and report.first_bad_index == [7]
    assert "1 elements differ (exact match required" in report.message


def test_boolean_outputs_must_match_exactly():
    ref = torch.tensor([True, False, True])
    assert compare_outputs(0, ref, ref.clone(), ATOL, RTOL).correct
    report = compare_outputs(0, ref, torch.tensor([True, True, True]), ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [1]


def test_complex_outputs_must_match_exactly():
    ref = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert compare_outputs(0, ref, ref.clone(), ATOL, RTOL).correct
    assert not compare_outputs(0, ref, ref + 1e-6, ATOL, RTOL).correct


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_use_the_tolerance(dtype):
    ref = torch.linspace(-4, 4, 33, dtype=dtype)
    assert compare_outputs(0, ref, ref + 0.005, ATOL, RTOL).correct
    assert not compare_outputs(0, ref, ref + 0.5, ATOL, RTOL).correct


def test_tuple_outputs_are_compared_element_by_element():
    a, b = torch.randn(3), torch.arange(4)
    assert compare_outputs(0, (a, b), (a.clone(), b.clone()), ATOL, RTOL).correct
    assert compare_outputs(0, [a, b], (a.clone(), b.clone()), ATOL, RTOL).correct  # list vs tuple: same sequence
    bad = b.clone()
    bad[3] = 99
    report = compare_outputs(0, (a, b), (a.clone(), bad), ATOL, RTOL)
    assert not report.correct and report.message.startswith("output 1:") and report.first_bad_index == [3]
    report = compare_outputs(0, (a, b), (a + 1, b), ATOL, RTOL)
    assert not report.correct and report.message.startswith("output 0:")


def test_wrong_number_of_outputs():
    a = torch.randn(3)
    report = compare_outputs(0, (a, a), (a,), ATOL, RTOL)
    assert not report.correct and report.message == "returned 1 outputs, expected 2"
    assert not compare_outputs(0, (a,), (a, a), ATOL, RTOL).correct
    assert not compare_outputs(0, a, (a, a), ATOL, RTOL).correct


def test_a_tensor_is_not_a_one_element_tuple():
    a = torch.randn(3)
    assert not compare_outputs(0, a, (a.clone(),), ATOL, RTOL).correct
    assert not compare_outputs(0, (a,), a.clone(), ATOL, RTOL).correct


def test_non_tensor_candidate_outputs_fail():
    ref = torch.randn(3)
    for cand in (None, 1.0, ref.tolist(), "tensor", {"out": ref}):
        report = compare_outputs(0, ref, cand, ATOL, RTOL)
        assert not report.correct, cand
    assert "not a tensor" in compare_outputs(0, ref, None, ATOL, RTOL).message


def test_tensor_subclass_candidates_fail():
    class Agreeable(torch.Tensor):
        def __eq__(self, other):
            return True

    ref = torch.randn(3)
    report = compare_outputs(0, ref, ref.clone().as_subclass(Agreeable), ATOL, RTOL)
    assert not report.correct and "tensor subclass (Agreeable)" in report.message


def test_a_parameter_is_a_plain_tensor_for_the_comparison():
    ref = torch.randn(3)
    assert compare_outputs(0, ref, torch.nn.Parameter(ref.clone(), requires_grad=False), ATOL, RTOL).correct


def test_first_bad_index_and_max_errors_are_reported_for_nd_outputs():
    ref = torch.zeros(3, 4, 5)
    cand = ref.clone()
    cand[1, 2, 3] = 0.5
    cand[2, 0, 0] = -2.0
    report = compare_outputs(4, ref, cand, ATOL, RTOL)
    assert not report.correct and report.trial == 4
    assert report.first_bad_index == [1, 2, 3]
    assert report.max_abs_error == pytest.approx(2.0)
    assert report.max_rel_error == pytest.approx(2.0 / 1e-12)   # relative to a zero reference: clamped, huge
    assert "2 of 60 elements outside atol=0.01, rtol=0.01" in report.message
    assert "max abs error 2" in report.message
    assert "first bad index [1, 2, 3]: got 0.5, expected 0" in report.message


def test_max_errors_are_reported_for_passing_outputs_too():
    ref = t(1.0, 2.0, 4.0)
    report = compare_outputs(0, ref, t(1.001, 2.0, 4.02), ATOL, RTOL)
    assert report.correct
    assert report.max_abs_error == pytest.approx(0.02, rel=1e-4)
    assert report.max_rel_error == pytest.approx(0.005, rel=1e-4)


def test_layout_does_not_matter_only_values():
    ref = torch.randn(8, 8)
    cand = ref.t().contiguous().t()   # same values, transposed strides
    assert not cand.is_contiguous()
    assert compare_outputs(0, ref, cand, ATOL, RTOL).correct
    assert compare_outputs(0, ref, ref.clone().requires_grad_(True), ATOL, RTOL).correct


def test_empty_and_scalar_outputs():
    assert compare_outputs(0, torch.zeros(0, 3), torch.zeros(0, 3), ATOL, RTOL).correct
    assert compare_outputs(0, torch.tensor(2.0), torch.tensor(2.001), ATOL, RTOL).correct
    report = compare_outputs(0, torch.tensor(2.0), torch.tensor(3.0), ATOL, RTOL)
    assert not report.correct and report.first_bad_index == []


@pytest.mark.parametrize("seed", range(40))
def test_the_quick_check_of_passing_outputs_agrees_with_the_full_one(seed, monkeypatch):
    """Outputs that pass are judged by a few whole-tensor passes (compare._all_close), anything
    else by the full check: on random near misses, NaN, Inf and the tolerance's edge, both say
    the same, with the same errors (to float32's precision: the quick check of an output of 32
    bits or fewer runs in float32)."""
    from kernel_env.evaluators.child import compare

    g = torch.Generator().manual_seed(seed)
    dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[seed % 4]
    ref = (torch.randn(257, generator=g) * 10 ** (seed % 3)).to(dtype)
    scale = (0.3, 0.6, 0.9, 1.2, 2.0)[seed % 5]  # of the tolerance: within it, at its edge, beyond it
    noise = (torch.rand(257, generator=g) * 2 - 1) * (ATOL + RTOL * ref.double().abs()) * scale
    cand = (ref.double() + noise).to(dtype)
    if seed % 7 == 1:
        cand[seed % 257] = NAN
    if seed % 7 == 2:
        ref[3], cand[3] = INF, INF
    if seed % 7 == 3:
        ref[4], cand[4] = NAN, NAN
    if seed % 7 == 4:
        ref[5] = INF
    before = ref.clone(), cand.clone()
    quick = compare_outputs(0, ref, cand, ATOL, RTOL)  # 15 of the 40 cases pass, 25 fail
    for kept, now in zip(before, (ref, cand)):  # nothing compared is changed (float64 ones were, once)
        torch.testing.assert_close(now, kept, rtol=0, atol=0, equal_nan=True)
    monkeypatch.setattr(compare, "_all_close", lambda *args: None)
    full = compare_outputs(0, ref, cand, ATOL, RTOL)
    assert (quick.correct, quick.message, quick.first_bad_index) == (full.correct, full.message, full.first_bad_index)
    assert quick.max_abs_error == pytest.approx(full.max_abs_error, rel=1e-6)
    assert quick.max_rel_error == pytest.approx(full.max_rel_error, rel=1e-6)


@pytest.mark.parametrize("tolerance", [1e-2, 1e-3, 3e-5])
def test_the_tolerance_boundary_of_float32_outputs_is_the_float64_rule(tolerance):
    # The rule as the full check reads it, in float64 (where the difference of two float32
    # values is exact): |cand - ref| <= atol + rtol * |ref|. Every element of ``inside`` is the
    # farthest float32 that meets it; one step further out must fail, whichever element it is and
    # whatever the reference's magnitude, though the quick check runs in float32.
    dtype = torch.float32
    generator = torch.Generator().manual_seed(7)
    ref = (torch.randn(4096, generator=generator) * 10.0 ** torch.randint(-4, 5, (4096,), generator=generator)).to(dtype)
    ref64 = ref.double()

    def meets(cand: torch.Tensor) -> torch.Tensor:
        return (cand.double() - ref64).abs() <= tolerance + tolerance * ref64.abs()

    away = torch.full_like(ref, float("inf"))
    inside = (ref64 + (tolerance + tolerance * ref64.abs())).to(dtype)
    for _ in range(4):  # the rounded bound, moved to the last value that meets the rule
        inside = torch.where(meets(inside), inside, torch.nextafter(inside, ref))
        further = torch.nextafter(inside, away)
        inside = torch.where(meets(further), further, inside)
    assert bool(meets(inside).all()) and not bool(meets(torch.nextafter(inside, away)).any())
    assert compare_outputs(0, ref, inside, tolerance, tolerance).correct
    for index in torch.randint(0, 4096, (64,), generator=generator).tolist():
        cand = inside.clone()
        cand[index] = torch.nextafter(inside[index], away[index])
        report = compare_outputs(0, ref, cand, tolerance, tolerance)
        assert not report.correct and report.first_bad_index == [index]


def _timed(median: float, relative_error: float | None) -> Timing:
    return Timing(median_ms=median, min_ms=median, max_ms=median, calls=30,
                  sem_ms=None if relative_error is None else median * relative_error)


@pytest.mark.parametrize(("runtime", "error", "expected"), [
    (95.5, 0.01, ["eager"]),    # 4.5 % faster, margin 5 %, each median's error 1 %: either way on another run
    (94.5, 0.01, ["eager"]),    # 5.5 %: milestone reached, but within two errors
    (80.0, 0.01, []),           # 20 %: far from the margin
    (95.5, 0.001, []),          # a precise measurement: 0.5 % from the margin is outside two errors
    (95.5, None, []),           # a record without an error decides nothing
])
def test_a_milestone_decided_within_the_measured_noise_is_a_close_call(runtime, error, expected):
    from kernel_env.evaluators.reward import close_calls

    result = EvalResult(job_id="j", task_id="t", language="cpp", device="cpu", mode=Mode.PROFILE, correct=True,
                        runtime=_timed(runtime, 0.01 if error is None else error), eager=_timed(100.0, error))
    assert close_calls(result) == expected


def test_a_large_output_is_compared_chunk_by_chunk_with_the_whole_outputs_counts(monkeypatch):
    """Chunks bound the comparison's work memory; the report is the whole output's: every bad
    element counted, the first one's index in the output's shape, the largest errors."""
    from kernel_env.evaluators.child import compare

    monkeypatch.setattr(compare, "_CHUNK", 7)  # 60 elements: nine chunks, the last one short
    ref = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    cand = ref.clone()
    cand[1, 2, 3] += 1.0
    cand[2, 0, 0] = float("nan")
    report = compare_outputs(0, ref, cand, ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [1, 2, 3]
    assert "2 of 60 elements outside" in report.message and "got 34, expected 33" in report.message
    assert "1 NaN where the reference is not NaN" in report.message and report.max_abs_error == pytest.approx(1.0)
    assert compare_outputs(0, ref, ref + 0.005, ATOL, RTOL).correct
    exact = compare_outputs(0, ref.long(), cand.nan_to_num().long(), ATOL, RTOL)
    assert not exact.correct and exact.first_bad_index == [1, 2, 3] and "2 elements differ" in exact.message


def test_a_strided_candidate_is_compared_in_the_references_element_order(monkeypatch):
    from kernel_env.evaluators.child import compare

    monkeypatch.setattr(compare, "_CHUNK", 5)
    ref = torch.randn(6, 4)
    cand = ref.t().contiguous().t()  # the same values, column-major
    assert not cand.is_contiguous() and compare_outputs(0, ref, cand, ATOL, RTOL).correct
    cand = cand.clone(memory_format=torch.preserve_format)
    cand[4, 1] += 1
    report = compare_outputs(0, ref, cand, ATOL, RTOL)
    assert not report.correct and report.first_bad_index == [4, 1]
