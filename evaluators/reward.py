"""Rewards: the CUDA Agent milestone reward (eq. 1) and the raw speed-up alternative. Pure functions."""

from __future__ import annotations

import math
from enum import Enum


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


def reward(kind: RewardKind | str, correct: bool, runtime_ms: float | None, eager_ms: float | None,
           compile_ms: float | None, margin: float = 0.05) -> float:
    if RewardKind(kind) is RewardKind.SPEEDUP:
        return speedup_reward(correct, runtime_ms, compile_ms)
    return float(milestone_reward(correct, runtime_ms, eager_ms, compile_ms, margin))
