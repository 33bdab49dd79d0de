"""Typed records that cross the evaluation boundary: the job, the settings, the result."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from kernel_env.config import DEFAULT_ATOL, DEFAULT_RTOL, DEFAULT_SPEEDUP_MARGIN

#: Whose fault a failed evaluation is (``EvalResult.fault``).
Fault = Literal["candidate", "evaluator"]


class Mode(str, Enum):
    VERIFY = "verify"    # correctness only
    PROFILE = "profile"  # correctness, then timing against eager and torch.compile
    FINAL = "final"      # the episode's trusted final evaluation: as profile, first in the queue


class EvalSettings(BaseModel):
    """Protocol constants. They live in the trusted parent; a candidate never sees or sets them."""

    trials: int = 5
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    timed_calls: int = 30                 # each one's outputs compared in full with the reference's; the
                                          # yardstick (the task's Model through the candidate's worker) as many
    warmup_calls: int = 3
    # A candidate whose milestone lies within its measurement's noise (reward.close_calls) gets more
    # calls in the same timing run, pooled, up to this many times timed_calls; one still within it is
    # not paid the speed-up (reward.established_milestone).
    timing_runs: int = 3
    flush_bytes: int = 128 << 20          # the cache flush inside each call, twice (an H100's L2 is 50 MB, an H200's 60)
    job_timeout_s: float = 600.0          # bound on a timing run (baselines: torch.compile's first call is slow)
    step_timeout_s: float = 300.0         # bound on every other step (import, trials): an endless loop ends here
    # A candidate's steps end sooner: each within a floor plus a multiple of what the same work took the
    # reference (its timing run: of what its own warm-up took), never past the bounds above (harness.py).
    step_floor_s: float = 60.0            # loading ModelNew, its trials, its warm-up (Triton compiles on a first call)
    timing_floor_s: float = 10.0          # its timing run, which has the device to itself (everything is compiled by then)
    step_multiple: float = 20.0
    build_timeout_s: float = 300.0        # the final evaluation's clean build (`utils/compile.sh`) in the agent's sandbox
    compile_baseline: bool = True
    # Task hardening (child/screen.py): the trials draw their inputs from several distributions and
    # scales, and a task that a trivial answer passes (zeros, a constant, a copied input or trial) is
    # not evaluated (an evaluator fault, never a reward).
    vary_inputs: bool = True
    refuse_trivial_tasks: bool = True
    speedup_margin: float = DEFAULT_SPEEDUP_MARGIN  # "more than 5 % faster"
    # Torch computing inside ModelNew.forward is a violation (the skill's rule). Off only to run a
    # task's own Model as the candidate, which checks the harness itself (benchmarks/kernelbench.py):
    # the audit still runs, and every other rule holds.
    own_kernels_only: bool = True

    @classmethod
    def short(cls, **changes) -> EvalSettings:
        """The short protocol of smoke runs and CPU tests: 5 timed calls after 1 warm-up, no
        torch.compile baseline (``changes`` on top). Noisier timings than the default's: never
        for figures anyone reports."""
        return cls(**{"timed_calls": 5, "warmup_calls": 1, "compile_baseline": False, **changes})

    def timing_protocol(self) -> dict:
        """The settings a baseline timing depends on (part of the baseline cache key)."""
        return {"timed_calls": self.timed_calls, "warmup_calls": self.warmup_calls, "flush_bytes": self.flush_bytes}


class EvalJob(BaseModel):
    """One evaluation of one candidate snapshot."""

    job_id: str
    task_id: str
    task_code: str
    language: str
    device: str = "cuda"                 # cuda | cpu
    mode: Mode = Mode.VERIFY
    snapshot_dir: Path                   # model_new.py, kernels/, build/ copied out of the workspace
    snapshot_hash: str = ""
    settings: EvalSettings = Field(default_factory=EvalSettings)

    @property
    def priority(self) -> int:
        """Smaller runs first: final evaluations before profiling before verification."""
        return {Mode.FINAL: 0, Mode.PROFILE: 1, Mode.VERIFY: 2}[self.mode]


class TrialReport(BaseModel):
    trial: int
    correct: bool
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_bad_index: list[int] | None = None
    # The precision contract (docs/security.md), on the calls it checks: the relative error against
    # the task's Model in float64, the task's own code's, the limit above which an answer is refused;
    # or why the call was not checked.
    float64_error: float | None = None
    eager_float64_error: float | None = None
    float64_error_limit: float | None = None
    precision_note: str | None = None


class Timing(BaseModel):
    """Milliseconds per call (``evaluators/clock.py``). ``method``: ``local``, a baseline's own calls
    in the judge's process, summed up by their median; ``worker`` (eager on the CPU), the Model's
    calls through the candidate's worker before the candidate existed there, less the judge's own
    share of a call; ``relative``, a candidate's: eager's time
    plus the trimmed mean of its calls through its worker (``raw_ms``, the whole call on the
    judge's clock) less that of the task's Model's calls through the same worker before the
    candidate existed there (``yardstick_raw_ms``); its quartiles and extremes are its calls shifted
    alike. ``sem_ms``: the standard error of ``median_ms`` (a relative time's with its yardstick's,
    eager's and the drift); ``drift``: the machine's pace beside the candidate's calls over its pace
    beside the yardstick's, less 1 (the judge's own calls of the Model before each run; on a GPU only:
    on the CPU a model's pace in the judge says nothing of its pace in the worker)."""

    median_ms: float
    min_ms: float
    max_ms: float
    calls: int
    p25_ms: float | None = None
    p75_ms: float | None = None
    sem_ms: float | None = None
    method: Literal["local", "worker", "relative"] = "local"
    raw_ms: float | None = None
    yardstick_raw_ms: float | None = None
    drift: float | None = None


class EvalResult(BaseModel):
    """Everything the harness learned; ``error`` and ``violations`` say why a candidate failed."""

    job_id: str
    task_id: str
    language: str
    device: str
    device_name: str = ""
    ran_on: str = ""                     # where the job ran: host and device (cuda:N is the host's GPU N)
    mode: Mode
    compiled: bool = True
    correct: bool = False
    trials: list[TrialReport] = Field(default_factory=list)
    runtime: Timing | None = None
    eager: Timing | None = None
    compiled_baseline: Timing | None = None
    violations: list[str] = Field(default_factory=list)
    error: str | None = None
    reward: float | None = None
    snapshot_hash: str = ""
    duration_s: float = 0.0
    steps_s: dict[str, float] = Field(default_factory=dict)  # where duration_s went: child starts, commands, comparisons
    log_tail: str = ""
    #: Whose fault a failure is: the candidate's (wrong, crashed, hung, broke a rule) or the
    #: evaluator's (a child that could not start, the reference or the task failing, a worker lost,
    #: a harness error); None when correct. An evaluator's fault is never paid as a reward.
    fault: Fault | None = None
    #: Baselines ("eager", "compile") whose milestone decision lies within the measured noise after
    #: every call the timing run may add: the speed-up's distance from the margin is under twice its
    #: standard error, so another run may decide it the other way; such a speed-up is not paid
    #: (reward.close_calls, reward.established_milestone). "floor": the time lies that close to its
    #: physical floor.
    close_calls: list[str] = Field(default_factory=list)
    #: The least time a call of the task can take on this device (floor.py): its inputs read and outputs
    #: written at the most bandwidth the device was measured to move (x1.5). None where not timed, or
    #: where the task's own eager code ran under it. A time under it pays no speed-up; one surely
    #: under it is refused.
    physical_floor_ms: float | None = None
    # What the verdict was judged with (the job's settings), so every report states the real numbers.
    atol: float = EvalSettings.model_fields["atol"].default
    rtol: float = EvalSettings.model_fields["rtol"].default
    speedup_margin: float = EvalSettings.model_fields["speedup_margin"].default

    @property
    def runtime_ms(self) -> float | None:
        return self.runtime.median_ms if self.runtime else None

    @property
    def eager_ms(self) -> float | None:
        return self.eager.median_ms if self.eager else None

    @property
    def compile_ms(self) -> float | None:
        return self.compiled_baseline.median_ms if self.compiled_baseline else None

    @property
    def speedup_vs_eager(self) -> float | None:
        return self.eager_ms / self.runtime_ms if self.eager_ms and self.runtime_ms else None

    @property
    def speedup_vs_compile(self) -> float | None:
        return self.compile_ms / self.runtime_ms if self.compile_ms and self.runtime_ms else None

    def summary(self) -> dict:
        """The flat record `kernel-env run-task --json` prints."""
        return {
            "task_id": self.task_id, "language": self.language, "device": self.device, "device_name": self.device_name,
            "mode": self.mode.value, "compiled": self.compiled, "correct": self.correct, "reward": self.reward,
            "runtime_ms": self.runtime_ms, "eager_ms": self.eager_ms, "compile_ms": self.compile_ms,
            "speedup_vs_eager": self.speedup_vs_eager, "speedup_vs_compile": self.speedup_vs_compile,
            "error": self.error, "fault": self.fault, "violations": self.violations, "snapshot_hash": self.snapshot_hash,
            "close_calls": self.close_calls, "physical_floor_ms": self.physical_floor_ms,
            # why a candidate that ran was wrong (its first failed trial: how many elements, how far off)
            "mismatch": next((trial.message for trial in self.trials if not trial.correct), None),
        }
