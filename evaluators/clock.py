"""What a time is: the baselines' own, and a candidate's relative to the task's Model in its own process.

Pure functions over the judge's measurements (``child/judge.py``); the harness calls them. The
rule they implement (docs/design.md, One call, and the clock):

- A baseline (eager, torch.compile) is timed in the judge's own process (``RefTime``), as
  ``do_bench`` times a callable: no other process, no round trip, nothing taken out (``local``).
  On the CPU, where a model's speed depends on its process, eager's is the yardstick's (below)
  less the judge's own share of a call (``through_worker``).
- A candidate's call crosses processes, and every call through a worker carries the round trip
  (the judge's copies, the GPU switching contexts: ~0.5 ms on an H200), whose size differs by a few
  microseconds from one worker process to the next. So before any candidate code exists in the
  worker, the task's Model runs through that same worker (the **yardstick**); the candidate's time
  is the Model's own time plus the difference of the two runs' trimmed means through the one
  process (``relative``). The round trip cancels whole; nothing the candidate's process can move is in
  what it is compared with.
- Every time carries the standard error of its central value (``sem``); a relative time's includes the
  yardstick's, and how far the machine's pace moved between the two runs beyond its noise (the
  judge's own calls of the Model before each: ``drift``), so a decision knows how sure it is
  (``reward.close_calls``).
"""

from __future__ import annotations

import math
import statistics

from kernel_env.evaluators.records import Timing

#: The standard error of a median is about this times the spread over the square root of the count
#: (sqrt(pi / 2) = 1.2533 for a normal sample, and its standard deviation is the interquartile range
#: over 1.349): 0.929 * IQR / sqrt(n).
_SEM_PER_IQR = math.sqrt(math.pi / 2) / 1.349
#: The share of calls dropped at each end before a run's calls through a worker are averaged (``trimmed_mean``).
TRIM = 0.2
#: A time below this is reported as this (a difference of two runs can be below zero for a model
#: that does next to nothing beside a slow Model).
FLOOR_MS = 1e-3


def local(times: list[float]) -> Timing:
    """A model's own calls in the judge's process, summed up."""
    median, quartiles = _summary(times)
    return Timing(median_ms=median, min_ms=min(times), max_ms=max(times), calls=len(times), p25_ms=quartiles[0],
                  p75_ms=quartiles[2], sem_ms=sem(times), method="local")


def through_worker(yardstick: list[float], shares: list[float]) -> Timing:
    """(The CPU.) The Model's own time in the worker: its calls through the worker before any candidate
    code existed there, less the judge's own share of a call measured beside them (``_own_share``).
    On the CPU a model's speed depends on its process (its allocator's state: the same eager chain
    ran 7 ms in the judge and 11 ms in the worker), so eager's time in the judge is not the worker's;
    nothing here was measured after the candidate was loaded."""
    share = statistics.median(shares)
    own = [max(t - share, FLOOR_MS) for t in yardstick]
    _, quartiles = _summary(own)
    return Timing(median_ms=max(trimmed_mean(yardstick) - share, FLOOR_MS), min_ms=min(own), max_ms=max(own),
                  calls=len(own), p25_ms=quartiles[0], p75_ms=quartiles[2],
                  sem_ms=math.hypot(trimmed_sem(yardstick), sem(shares)), method="worker")


def relative(eager: Timing, yardstick: list[float], yardstick_local: list[float], calls: list[float],
             calls_local: list[float]) -> Timing:
    """A candidate's time: ``eager`` (the Model's own time: ``local``, or ``through_worker``) plus what its ``calls`` through a worker
    took beyond the Model's calls through the same worker before the candidate existed there
    (``yardstick``), each run's calls summed up by their trimmed mean (``trimmed_mean``).
    ``*_local``: the judge's own calls of the Model before each run, the machine's pace."""
    base = trimmed_mean(yardstick)
    difference = trimmed_mean(calls) - base
    shifted = [max(eager.median_ms + t - base, FLOOR_MS) for t in calls]
    _, quartiles = _summary(shifted)
    drift, moved = None, 0.0
    if calls_local and yardstick_local:  # (none on the CPU: the judge's pace is not the worker's there)
        drift = statistics.median(calls_local) - statistics.median(yardstick_local)
        # The pace moved by what the two batches' medians differ beyond their own noise (two standard errors).
        moved = max(0.0, abs(drift) - 2 * math.hypot(sem(calls_local), sem(yardstick_local)))
    error = math.sqrt(trimmed_sem(calls) ** 2 + trimmed_sem(yardstick) ** 2 + moved ** 2 + (eager.sem_ms or 0.0) ** 2)
    return Timing(median_ms=max(eager.median_ms + difference, FLOOR_MS), min_ms=min(shifted), max_ms=max(shifted),
                  calls=len(calls), p25_ms=quartiles[0], p75_ms=quartiles[2], sem_ms=error, method="relative",
                  raw_ms=trimmed_mean(calls), yardstick_raw_ms=base,
                  drift=None if drift is None else drift / max(statistics.median(yardstick_local), FLOOR_MS))


def trimmed_mean(times: list[float]) -> float:
    """The mean of the middle ``1 - 2 * TRIM`` of ``times``: the trim drops the stalls a call through
    another process now and then takes; where calls fall in modes (a worker's done word written by a
    kernel put them in two, 7 us apart: ``exchange.Flags``), a mean moves with the modes' shares
    where a median jumps by their whole gap."""
    ordered = sorted(times)
    cut = int(len(ordered) * TRIM)
    kept = ordered[cut:len(ordered) - cut] or ordered
    return statistics.fmean(kept)


def trimmed_sem(times: list[float]) -> float:
    """The standard error of ``trimmed_mean`` (the winsorized deviation over (1 - 2 * TRIM) * sqrt(n))."""
    if len(times) < 2:
        return math.inf
    ordered = sorted(times)
    cut = int(len(ordered) * TRIM)
    low, high = ordered[cut], ordered[len(ordered) - 1 - cut]
    winsorized = [min(max(t, low), high) for t in ordered]
    return statistics.stdev(winsorized) / ((1 - 2 * TRIM) * math.sqrt(len(times)))


def scaled(timing: Timing, factor: float) -> Timing:
    """``timing`` at another pace (a cached torch.compile time, by this job's eager time over the eager
    time cached with it: the two were timed alternating, so their ratio holds where the pace moved)."""
    fields = ("median_ms", "min_ms", "max_ms", "p25_ms", "p75_ms", "sem_ms")
    return timing.model_copy(update={f: getattr(timing, f) * factor for f in fields if getattr(timing, f) is not None})


def sem(times: list[float]) -> float:
    """The standard error of the median of ``times`` (from their interquartile range)."""
    if len(times) < 2:
        return math.inf
    _, quartiles = _summary(times)
    return _SEM_PER_IQR * (quartiles[2] - quartiles[0]) / math.sqrt(len(times))


def _summary(times: list[float]) -> tuple[float, list[float]]:
    if not times:
        raise ValueError("no times to sum up")
    quartiles = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), quartiles
