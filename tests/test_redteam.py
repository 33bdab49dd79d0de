"""Red-team attacks on the trusted evaluation (issue 32's judge/worker split), on the CPU.

Each test states what the harness MUST do with one attack (a fixture tests/candidates/triton/redteam_*.py);
a working attack shows up as a failing test. The source rules are switched off (``past_rules``) so that
the architecture alone is tested: reflection, gc, sys.modules, sockets, os and ctypes inside the worker.
Written by a red-team pass on the first version of the judge, where five of them broke it (an answer
queued before its ``Go`` was timed below its work; a malformed answer line raised out of ``evaluate``,
which the pool answers as the evaluator's fault); they hold since.
"""

from __future__ import annotations

import time

import pytest
from test_evaluation import (  # noqa: F401 - fixtures, found by pytest by name
    SETTINGS,
    Deadline,
    assert_honest,
    assert_rejected,
    baselines,
    jobs,
    kill_candidate,
    make_job,
    past_rules,
    why,
)

from kernel_env.evaluators import harness
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import Mode
from kernel_env.runtime.pool import LocalPool

pytestmark = pytest.mark.slow  # every attack through the whole harness, after test_evaluation's jobs

#: Timed like the default protocol (30 timed calls): the attacks' medians are less noisy on a busy 2-core machine.
TIMED = SETTINGS.model_copy(update={"timed_calls": 30})


def _profile(jobs, name: str, settings=TIMED):
    jobs.ensure_baselines()
    started = time.monotonic()
    result = jobs._evaluate("triton", name, Mode.PROFILE, settings)
    print(f"\n{name}: {time.monotonic() - started:.1f}s\n{why(result)}\nsteps: {result.steps_s}")
    if result.runtime is not None:
        print(f"runtime {result.runtime}")
    return result


def _answered(jobs, name: str, mode: Mode = Mode.VERIFY, settings=SETTINGS):
    """The result of evaluating candidate ``name``: evaluate() must return one, since an exception out of
    it is answered by the pool as the evaluator's fault (pool._error), which pays no -1."""
    job = make_job(jobs.snapshot("triton", name), "triton", mode, settings)
    try:
        result = evaluate(job, baselines=jobs.baselines)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"evaluate() raised {type(exc).__name__}: {str(exc)[:300]}; the pool answers that with "
                    "fault='evaluator' (reward 0 instead of -1)")
    print(why(result)[:600])
    return result


# ============================================================================ the clock


def test_answering_a_timed_call_before_its_go_is_timed_whole(jobs, past_rules):
    """A hook answers every call past the worker's own code (``kernels/hijack.py``): eager's ops straight
    into the spill buffer, without the worker's decoding, model call, audit or copy, all of which the
    yardstick spent. It must not be timed faster than about eager."""
    result = _profile(jobs, "redteam_done_before_go")
    if result.correct:
        assert result.runtime_ms >= 0.5 * result.eager_ms, why(result)
    else:
        assert_rejected(result, "elements outside", "returned a wrong result", "protocol", "changed the harness", "interfered")


@pytest.fixture(scope="module")
def control(jobs):
    """Eager's own ops in every call, timed through the worker's standard path (the torch rule off)."""
    jobs.wait_all()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "check_sources", lambda snapshot: [])
        return _profile(jobs, "redteam_torch_control", TIMED.model_copy(update={"own_kernels_only": False}))


def test_control_runs_eager_ops_at_about_eager_speed(control):
    assert control.correct, why(control)


def test_answering_a_timed_call_before_its_go_is_no_faster_than_the_same_work(jobs, past_rules, control):
    result = _profile(jobs, "redteam_done_before_go")
    if result.correct:
        assert result.runtime_ms >= 0.5 * control.runtime_ms, (why(result), control.runtime_ms)
    else:
        assert_rejected(result, "elements outside", "returned a wrong result", "protocol", "changed the harness", "interfered")


# ============================================================================ the CPU's boundary by construction (issue 45)
# Each attack below answers correctly only where its class works: none may be paid.


def test_a_calls_inputs_cannot_be_seen_before_its_go(jobs, past_rules):
    """Class 2: every memfd the worker held before a call's Go is searched for that call's inputs."""
    assert_rejected(_answered(jobs, "redteam_inputs_before_go"), "elements outside")


def test_an_output_cannot_be_computed_into_the_judges_spill_buffer(jobs, past_rules):
    """Class 3: the forward looks for a buffer of the judge's it can write its output into, and returns that."""
    assert_rejected(_answered(jobs, "redteam_output_into_spill"), "elements outside")


def test_no_call_of_a_candidates_runs_without_the_audit(jobs, past_rules):
    """Class 4: a forward that raises on any call without the audit's mode on torch's stack: warm-up and
    timed calls included, every call is audited, so it is the honest kernel it otherwise is."""
    result = _profile(jobs, "redteam_unaudited_call")
    assert_honest(result)
    assert result.runtime is not None, why(result)


def test_punching_holes_in_the_judges_memfds_moves_nothing_subtracted_from_a_call(jobs, past_rules):
    """Class 1: the worker punches holes through every memfd it was sent, between and inside its calls."""
    honest = _profile(jobs, "honest")
    result = _profile(jobs, "redteam_punch_memfds")
    assert_honest(honest)
    if result.correct:  # the half is two runs' noise on this machine; a subtraction moved would put it near zero
        assert result.runtime_ms >= 0.5 * honest.runtime_ms, (why(result), honest.runtime_ms)
    else:
        assert_rejected(result, "elements outside", "returned a wrong result", "modified its input")


# ============================================================================ the harness's reads of a child's answers


@pytest.mark.parametrize("name", ["redteam_reply_non_ascii_mac", "redteam_reply_nested_json"])
def test_a_malformed_answer_line_is_the_candidates_fault_and_never_raises(jobs, past_rules, name):
    """evaluate() must return a result (``_answered``), and the line is the candidate's fault."""
    assert_rejected(_answered(jobs, name), "did not write", "broke the protocol")


def test_through_the_pool_a_malformed_answer_line_is_not_the_evaluators_fault(jobs, past_rules):
    pool = LocalPool(["cpu"], jobs_per_cpu=1, baselines=jobs.baselines)
    try:
        result = pool.submit(make_job(jobs.snapshot("triton", "redteam_reply_non_ascii_mac"), "triton", Mode.VERIFY)).result(timeout=300)
    finally:
        pool.close()
    print(why(result))
    assert_rejected(result, "did not write", "broke the protocol")


# ============================================================================ the shared memory


def test_truncating_the_shared_memfd_is_the_candidates_fault(jobs, past_rules):
    result = _answered(jobs, "redteam_truncate_memfd")
    # The memfd's size is sealed: the worker's ftruncate is refused (EPERM) in its own forward.
    assert_rejected(result, "Operation not permitted", "judge", "protocol", "died")


# ============================================================================ the judge's reads of the worker's messages


def test_a_done_the_judge_cannot_decode_is_the_candidates_fault(jobs, past_rules):
    result = _answered(jobs, "redteam_done_nested_json")
    assert_rejected(result, "protocol", "RecursionError", "failed")


# ============================================================================ the worker's own reports (defence in depth)


def test_a_candidate_that_re_signs_the_workers_reports_is_judged_on_its_outputs_alone(jobs, past_rules):
    """The worker's own reports (integrity, threads, modes) are its word: a candidate that finds the
    channel's key re-signs clean ones (docs/design.md, Known limits: the rules are a sieve). What it
    cannot forge is the judge's verdict: correct only where every trial's outputs are."""
    result = jobs._evaluate("triton", "redteam_forged_integrity", Mode.VERIFY)
    print(why(result))
    if result.correct:
        assert result.reward == 1 and len(result.trials) == SETTINGS.trials and all(t.correct for t in result.trials), why(result)
    else:
        assert_rejected(result, "the worker.ops was replaced", "left threads running", "threads running beside")


def test_answering_before_go_with_the_honest_kernel_is_no_faster_than_the_honest_kernel(jobs, past_rules):
    honest = _profile(jobs, "honest")
    result = _profile(jobs, "redteam_done_before_go_triton")
    assert_honest(honest)
    if result.correct:
        # The discount is at most the judge's round trip (~0.2 ms) against ~3 ms. Two runs' medians on this
        # small machine differ by up to ~1.6x (seen: 3.5 and 5.0 ms for the same work), hence the half: what
        # the test catches is the work itself escaping the clock, which would put the time near zero.
        assert result.runtime_ms >= 0.5 * honest.runtime_ms, (why(result), honest.runtime_ms)
    else:
        assert_rejected(result, "elements outside", "returned a wrong result", "protocol", "changed the harness", "interfered")


def test_findings_flooded_into_every_answer_neither_kill_the_judge_nor_buy_time(jobs, past_rules):
    """The judge keeps the worker's findings for audited calls alone, and so much of them at most: a flood
    of them in every Done costs the candidate its own time, nothing of the judge's."""
    jobs.ensure_baselines()
    honest = _profile(jobs, "honest")
    result = _answered(jobs, "redteam_findings_flood", Mode.PROFILE, TIMED)
    if result.correct:  # as above: the half is two runs' noise on this machine; a time bought would be near zero
        assert result.runtime_ms >= 0.5 * honest.runtime_ms, (why(result), honest.runtime_ms)
    else:
        assert_rejected(result, "torch computes")


# ============================================================================ the precision contract


def test_float16_math_on_a_float32_task_is_refused(jobs):
    """relu(x + y) computed in float16: within the 1e-2 tolerance, at a precision the task does not have."""
    result = _answered(jobs, "redteam_half_precision")
    assert_rejected(result, "less precise than the task's dtype")
    first = result.trials[0]
    assert first.float64_error > first.float64_error_limit > first.eager_float64_error, first


def test_float16_math_in_the_timed_calls_only_is_refused(jobs):
    """Full precision in the trials, float16 after: a timed call is held to the contract too."""
    result = _profile(jobs, "redteam_half_precision_when_timed")
    assert_rejected(result, "less precise than the task's dtype")
    assert "timed call" in why(result), why(result)
    assert all(t.correct for t in result.trials), "refused in a trial: the timed calls' contract was not what caught it"


def test_the_honest_kernel_is_held_to_the_contract_and_passes_it(jobs):
    result = jobs.verify("triton", "honest")
    assert_honest(result)
    first = result.trials[0]
    assert first.float64_error_limit is not None and first.float64_error < first.float64_error_limit / 10, first
