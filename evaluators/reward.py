"""Rewards: the CUDA Agent milestone reward (eq. 1) and the raw speed-up alternative.

One owner: the harness records the milestone of every result it concludes
(``EvalResult.reward``, with the settings' margin), and whatever pays a reward for a result
(the environments, the OpenHands plug-in, the reports) calls ``paid_reward`` — nothing
recomputes a milestone from the times.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_env.evaluators.records import EvalResult


class RewardKind(str, Enum):
    MILESTONE = "milestone"
    SPEEDUP = "speedup"


def faster(time_ms: float | None, baseline_ms: float | None, margin: float = 0.05) -> bool:
    """b(t, t0): (t0 - t) / t0 > margin. Unmeasured or impossible times (<= 0, NaN, inf) are never faster."""
    if not _valid(time_ms) or not _valid(baseline_ms):
        return False
    return (baseline_ms - time_ms) / baseline_ms > margin


def milestone_reward(correct: bool, runtime_ms: float | None, eager_ms: float | None, compile_ms: float | None,
                     margin: float = 0.05) -> int:
    """-1 incorrect (or does not build, or breaks a rule); 3 faster than eager and compile; 2 faster than eager; else 1."""
    if not correct:
        return -1
    return _milestone(faster(runtime_ms, eager_ms, margin), faster(runtime_ms, compile_ms, margin))


def _milestone(fast_eager: bool, fast_compile: bool) -> int:
    """3 faster than eager and compile; 2 faster than eager; else 1 (a correct candidate)."""
    if fast_eager and fast_compile:
        return 3
    return 2 if fast_eager else 1


def speedup_reward(correct: bool, runtime_ms: float | None, compile_ms: float | None) -> float:
    """The paper's alternative: t_compile / t for a correct candidate, -1 otherwise (0 if not timed)."""
    if not correct:
        return -1.0
    if not _valid(runtime_ms) or not _valid(compile_ms):
        return 0.0
    return compile_ms / runtime_ms


def _valid(time_ms: float | None) -> bool:
    """A time a real measurement can produce: finite and positive."""
    return time_ms is not None and math.isfinite(time_ms) and time_ms > 0


#: A speed-up is established when it clears the margin by this many standard errors.
CONFIDENCE = 2.0


def established_milestone(result: EvalResult) -> int:
    """The milestone a concluded result's timings establish: as ``milestone_reward``, but a speed-up
    over a baseline counts only where it clears the margin by ``CONFIDENCE`` standard errors of it
    (``_gain``): a kernel whose speed-up the measurement cannot tell from the margin is not paid it
    by chance. Timings without an error (records made by hand, or before errors were kept) decide
    by their medians alone."""
    if not result.correct:
        return -1
    if _under_floor(result):
        return 1
    return _milestone(_surely_faster(result, result.eager), _surely_faster(result, result.compiled_baseline))


def close_calls(result: EvalResult) -> list[str]:
    """The decisions a result's timings do not make sure of: the baselines ("eager", "compile") whose
    milestone decision b(t, t0) is not sure, the relative speed-up (t0 - t) / t0 lying within
    ``CONFIDENCE`` standard errors of the margin (from the two timings' ``sem_ms``: the errors of
    their central values, a candidate's with its yardstick's and the machine's drift); and "floor"
    where the time lies within them of its physical floor (``floor.py``). The harness times such a
    candidate further (``EvalSettings.timing_runs``); one still close after that is not paid the
    speed-up (``established_milestone``). A timing without an error decides nothing here."""
    found = []
    for name, baseline in (("eager", result.eager), ("compile", result.compiled_baseline)):
        gain = _gain(result, baseline)
        if gain is not None and gain[1] is not None and abs(gain[0] - result.speedup_margin) <= CONFIDENCE * gain[1]:
            found.append(name)
    runtime, floor = result.runtime, result.physical_floor_ms
    if (floor is not None and runtime is not None and runtime.sem_ms is not None
            and abs(runtime.median_ms - floor) <= CONFIDENCE * runtime.sem_ms):
        found.append("floor")
    return found


def _under_floor(result: EvalResult) -> bool:
    """Whether the result's time lies under its physical floor (``floor.py``): a time the device cannot
    reach pays no speed-up (one surely under it is refused by the harness)."""
    runtime, floor = result.runtime, result.physical_floor_ms
    return floor is not None and runtime is not None and runtime.median_ms < floor


def _surely_faster(result: EvalResult, baseline) -> bool:
    """``faster`` with the margin raised by ``CONFIDENCE`` standard errors of the speed-up."""
    gain = _gain(result, baseline)
    if gain is None:
        return False
    margin = result.speedup_margin + (CONFIDENCE * gain[1] if gain[1] is not None else 0.0)
    return faster(result.runtime.median_ms, baseline.median_ms, margin)


def _gain(result: EvalResult, baseline) -> tuple[float, float | None] | None:
    """(t0 - t) / t0 of the result's runtime against ``baseline``, and its standard error (None where a
    timing has none); None where either time is missing or impossible."""
    runtime = result.runtime
    if runtime is None or baseline is None or not _valid(runtime.median_ms) or not _valid(baseline.median_ms):
        return None
    t, t0 = runtime.median_ms, baseline.median_ms
    if runtime.sem_ms is None or baseline.sem_ms is None:
        return (t0 - t) / t0, None
    return (t0 - t) / t0, (t / t0) * math.hypot(runtime.sem_ms / t, baseline.sem_ms / t0)


def paid_reward(result: EvalResult, kind: RewardKind | str = RewardKind.MILESTONE) -> float:
    """The reward a trusted result pays: the milestone the harness recorded on it (-1 for a
    result it never concluded), or with ``kind="speedup"`` t_compile / t (-1 if incorrect).
    A result that failed by the evaluator's fault pays 0: it says nothing of the candidate, and
    the environments end such an episode as truncated, with the fault in ``info``."""
    kind = RewardKind(kind)
    if result.fault == "evaluator":
        return 0.0
    if kind is RewardKind.SPEEDUP:
        return speedup_reward(result.correct, result.runtime_ms, result.compile_ms)
    return float(result.reward) if result.reward is not None else -1.0
