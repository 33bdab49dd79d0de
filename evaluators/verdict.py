"""The one place a result is concluded: whether it is correct, whose fault a failure is, and its milestone.

Every result the evaluation returns passes through ``conclude`` (the harness's, at the end of a
job) or is made failed by ``failed`` (a job the harness never ran: a workspace that could not be
read, a protected file changed, a build that failed, a pool that lost the job). Nothing else
sets ``correct``, ``fault`` or ``reward``.
"""

from __future__ import annotations

from kernel_env.evaluators.records import EvalResult, Fault, Mode
from kernel_env.evaluators.reward import close_calls, established_milestone


def conclude(result: EvalResult, margin: float) -> EvalResult:
    """The result's verdict, whose fault a failure is, and the milestone its timings establish
    (``reward.established_milestone``). A failure is the candidate's unless it was named the
    evaluator's; an evaluator's fault gets no milestone: it says nothing of the candidate."""
    if result.error or result.violations:
        result.correct = False
    if result.correct:
        result.fault = None
    elif result.fault is None:  # wrong outputs or a broken rule
        result.fault = "candidate"
    result.speedup_margin = margin
    result.reward = None if result.fault == "evaluator" else established_milestone(result)
    result.close_calls = close_calls(result) if result.correct else []
    return result


def failed(*, job_id: str, task_id: str, language: str, device: str, mode: Mode, error: str, fault: Fault,
           margin: float = EvalResult.model_fields["speedup_margin"].default, **fields) -> EvalResult:
    """A failed result for a job that did not run to its end (``fields``: any other of EvalResult's)."""
    result = EvalResult(job_id=job_id, task_id=task_id, language=language, device=device, mode=mode, error=error,
                        fault=fault, **fields)
    return conclude(result, margin)
