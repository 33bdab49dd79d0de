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
    fast_eager = faster(runtime_ms, eager_ms, margin)
    if fast_eager and faster(runtime_ms, compile_ms, margin):
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


def close_calls(result: EvalResult) -> list[str]:
    """The baselines ("eager", "compile") whose milestone decision b(t, t0) lies within this
    machine's measured noise: the relative speed-up (t0 - t) / t0 is closer to the margin than
    the two timings' relative spreads added (``Timing.relative_spread``, the interquartile range
    over the median). Such a decision may go the other way on another run; the milestone still is
    what the numbers say. A timing without quartiles (an old cached baseline) decides nothing here."""
    found = []
    runtime = result.runtime
    for name, baseline in (("eager", result.eager), ("compile", result.compiled_baseline)):
        if runtime is None or baseline is None or not _valid(runtime.median_ms) or not _valid(baseline.median_ms):
            continue
        spreads = (runtime.relative_spread, baseline.relative_spread)
        if None in spreads:
            continue
        gain = (baseline.median_ms - runtime.median_ms) / baseline.median_ms
        if abs(gain - result.speedup_margin) < sum(spreads):
            found.append(name)
    return found


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
