"""Episode records and the paper's evaluation metrics over them. Pure: no sandbox, no I/O but
``read_records``.

- ``EpisodeRecord``: one line of a ``kernel-env eval`` run file (JSONL); ``read_records`` reads a
  run file (``RecordError`` for a file that is not one).
- ``compute_metrics`` -> ``Metrics`` (a ``GroupMetrics`` per level, and overall): the CUDA Agent /
  KernelBench figures; ``best_per_task``, ``group_metrics``, ``fast_p`` and ``geomean`` are its parts.
- ``UNDECIDED_STOPS``: the stops without a verdict on the solution, which a rerun tries again.

Before touching it: per task one record counts, the best (``best_per_task``), and only its *final*
evaluation: the evaluations during an episode ran on builds the agent controlled. An episode that
ended in error or by the evaluator's fault counts as a task that did not pass, and is counted
apart (``errors``, ``evaluator_faults``). A figure that cannot be computed is None, never 0. What
each figure means and what counts: docs/eval.md, The metrics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel_env.workloads.runs.journal import Journal, JournalError

#: KernelBench's fast_p thresholds: the fraction of tasks that are correct with a speed-up above p.
FAST_P = (0.0, 0.5, 1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
Baseline = Literal["eager", "compile"]
Stop = Literal["finished", "turn_limit", "context_limit", "error", "evaluator_fault"]
#: Stops with no trusted verdict on the solution: a rerun of the run file tries them again.
UNDECIDED_STOPS = ("error", "evaluator_fault")
OVERALL = "all"


class RecordError(ValueError):
    """A run file that cannot be read as episode records; the message names the file and line."""


class EpisodeRecord(BaseModel):
    """One finished episode, as ``kernel-env eval`` writes it (one JSON object per line); the keys
    are docs/eval.md's record table.

    ``stop``: "finished" (the model called Finish), "turn_limit", "context_limit", "error"
    (``error`` says why) or "evaluator_fault" (the final evaluation failed by the evaluator's
    fault, twice; ``error`` says how). ``final`` (``EvalResult.summary()`` of the final evaluation)
    and ``final_report`` are None on error; ``reward`` (the final milestone) is None on error or
    evaluator fault. ``evaluations`` holds every trusted evaluation of the episode, the final ones
    included. Unknown keys are kept, so a record round-trips through this model unchanged.
    """

    model_config = ConfigDict(extra="allow")

    task_id: str
    source: str = "file"
    level: int | None = None
    name: str = ""
    language: str = ""
    device: str = ""
    model: str = ""
    stop: Stop
    error: str | None = None
    final: dict[str, Any] | None = None
    final_report: str | None = None
    reward: float | None = None
    turns: int = 0
    max_turns: int | None = None
    tool_calls: int = 0
    invalid_calls: int = 0
    tokens: dict[str, int] | None = None
    rollout: dict[str, Any] | None = None
    evaluations: list[dict[str, Any]] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    settings: dict[str, Any] | None = None
    duration_s: float = 0.0
    timestamp: str = ""

    @property
    def correct(self) -> bool:
        return bool(self.final and self.final.get("correct"))

    def speedup(self, baseline: Baseline) -> float | None:
        """The final evaluation's speed-up vs ``baseline`` (eager | compile); None if not measured."""
        value = (self.final or {}).get(f"speedup_vs_{baseline}")
        return float(value) if _positive(value) else None


def read_records(path: str | Path) -> list[EpisodeRecord]:
    """Every record of a run file, read as ``kernel-env eval`` resumes it (a journal:
    ``journal.py``): blank lines skipped, a torn last line (a run killed mid-write) left out.

    Args:
        path: the run file.

    Returns:
        The records, in file order.

    Raises:
        RecordError: no such file, or one that cannot be read, or a line that is not an episode
            record (a torn record inside the file among them); the message names the line."""
    path = Path(path)
    journal = Journal(path)
    try:
        if not path.is_file():
            raise FileNotFoundError(2, "no such file")
        entries = journal.read()
    except JournalError as exc:
        raise _not_a_record(path, exc.line, exc.why) from None
    except OSError as exc:
        raise RecordError(f"run file {path}: cannot read it ({exc.strerror or exc})") from None
    if journal.skipped:
        raise _not_a_record(path, journal.skipped[0], "a torn record inside the file")
    records = []
    for entry in entries:
        try:
            records.append(EpisodeRecord.model_validate(entry.record))
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"]) or "the line"
            raise _not_a_record(path, entry.line, f"{where}: {problem['msg']}") from None
    return records


def _not_a_record(path: Path, line: int, why: str) -> RecordError:
    return RecordError(f"run file {path}, line {line}: not an episode record ({why}); is this a `kernel-env eval` output?")


# ============================================================================ metrics


@dataclass(frozen=True)
class GroupMetrics:
    """The figures of one level (``group`` "L1", "L2", ..., "no level") or of all tasks ("all").

    Each figure is over the group's tasks (one counted record each) but ``episodes`` and
    ``invalid_call_rate``, which are over every episode of the group. Rates are fractions in
    [0, 1]. ``faster``, ``geomean`` and ``fast_p`` are keyed by baseline ("eager", "compile");
    ``fast_p`` then by threshold p (``FAST_P``)."""

    group: str
    tasks: int
    episodes: int
    errors: int
    evaluator_faults: int
    passed: int
    pass_rate: float | None
    faster: dict[str, float | None]
    geomean: dict[str, float | None]
    fast_p: dict[str, dict[float, float | None] | None]
    mean_reward: float | None
    invalid_call_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: fast_p thresholds become keys like "fast_1.0"."""
        data = asdict(self)
        data["fast_p"] = {baseline: None if table is None else {f"fast_{p:g}": v for p, v in table.items()}
                          for baseline, table in self.fast_p.items()}
        return data


@dataclass(frozen=True)
class Metrics:
    """Per level (sorted; tasks without a level last) and overall."""

    levels: list[GroupMetrics]
    overall: GroupMetrics

    @property
    def groups(self) -> list[GroupMetrics]:
        """The levels, then overall: the rows of a table."""
        return [*self.levels, self.overall]

    def to_dict(self) -> dict[str, Any]:
        return {"levels": [group.to_dict() for group in self.levels], "overall": self.overall.to_dict()}


def compute_metrics(records: Iterable[EpisodeRecord]) -> Metrics:
    """The paper's metrics per level and overall (docs/eval.md, The metrics, says what counts).

    Args:
        records: every episode record of a run (or of several runs over the same tasks).

    Returns:
        The figures per level (sorted; tasks without a level last) and over all tasks."""
    records = list(records)
    by_level: dict[int | None, list[EpisodeRecord]] = defaultdict(list)
    for record in records:
        by_level[record.level].append(record)
    order = sorted(by_level, key=lambda level: (level is None, level or 0))
    return Metrics(levels=[group_metrics(level_name(level), by_level[level]) for level in order],
                   overall=group_metrics(OVERALL, records))


def level_name(level: int | None) -> str:
    return "no level" if level is None else f"L{level}"


def group_metrics(group: str, records: Sequence[EpisodeRecord]) -> GroupMetrics:
    """The figures over ``records`` (every episode of the group; the best per task counts)."""
    counted = list(best_per_task(records).values())
    correct = [record for record in counted if record.correct]
    tasks = len(counted)
    rewards = [record.reward for record in counted if record.reward is not None]
    calls = sum(record.tool_calls for record in records)
    return GroupMetrics(
        group=group,
        tasks=tasks,
        episodes=len(records),
        errors=sum(record.stop == "error" for record in counted),
        evaluator_faults=sum(record.stop == "evaluator_fault" for record in counted),
        passed=len(correct),
        pass_rate=_rate(len(correct), tasks),
        faster={b: _faster_rate(correct, tasks, b) for b in BASELINES},
        geomean={b: geomean(s for r in correct if (s := r.speedup(b)) is not None) for b in BASELINES},
        fast_p={b: _fast_p(correct, tasks, b) for b in BASELINES},
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        invalid_call_rate=_rate(sum(record.invalid_calls for record in records), calls),
    )


def best_per_task(records: Iterable[EpisodeRecord]) -> dict[str, EpisodeRecord]:
    """task_id → the record that counts for it: correct first, then the largest speed-up vs
    torch.compile, then vs eager, then reward; the earliest record wins a tie."""
    best: dict[str, EpisodeRecord] = {}
    for record in records:
        held = best.get(record.task_id)
        if held is None or _rank(record) > _rank(held):
            best[record.task_id] = record
    return best


def _rank(record: EpisodeRecord) -> tuple[bool, float, float, float, bool]:
    missing = -math.inf
    return (record.correct, record.speedup("compile") or missing, record.speedup("eager") or missing,
            missing if record.reward is None else record.reward, record.stop not in UNDECIDED_STOPS)


def fast_p(correct: Iterable[EpisodeRecord], tasks: int, baseline: Baseline, p: float) -> float | None:
    """KernelBench fast_p: the fraction of ``tasks`` whose solution is correct with speed-up > p.
    ``correct`` holds the counted correct records; one without a measured speed-up is not fast."""
    return _rate(sum(1 for r in correct if (s := r.speedup(baseline)) is not None and s > p), tasks)


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of positive numbers; None for none."""
    logs = [math.log(value) for value in values]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _measured(correct: Sequence[EpisodeRecord], baseline: Baseline) -> bool:
    """Whether the vs-baseline figures mean something: no correct solution (then nothing is
    faster, whatever was measured), or at least one correct solution timed against it."""
    return not correct or any(record.speedup(baseline) is not None for record in correct)


def _faster_rate(correct: Sequence[EpisodeRecord], tasks: int, baseline: Baseline) -> float | None:
    """Correct and faster than the baseline (speed-up > 1.0), over all tasks."""
    return fast_p(correct, tasks, baseline, 1.0) if _measured(correct, baseline) else None


def _fast_p(correct: Sequence[EpisodeRecord], tasks: int, baseline: Baseline) -> dict[float, float | None] | None:
    if not _measured(correct, baseline):
        return None
    return {p: fast_p(correct, tasks, baseline, p) for p in FAST_P}


def _rate(count: int, total: int) -> float | None:
    return count / total if total else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
