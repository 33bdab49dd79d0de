"""Trajectories for rejection fine-tuning (RFT) and SFT, from eval's episode records.

CUDA Agent fine-tunes on agent trajectories whose reward is positive and that hold no invalid
tool calls and no redundant loops. ``RftFilter`` is that rule, each part adjustable; ``export``
writes the kept trajectories as chat records a trainer reads as they are (TRL's SFTTrainer,
the OpenAI fine-tuning format): ``messages`` and ``tools``, with the task, the reward and the
accounting beside them for finer filters of one's own::

    kept = export(read_records("run.jsonl"), "rft.jsonl", RftFilter())
    kept.written, kept.dropped      # {"reward 1.0 is not above 1.0": 3, ...}

An episode that ended in error or by the evaluator's fault is never kept (its reward says
nothing of the model), whatever the filter.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kernel_env.workloads.analysis.metrics import UNDECIDED_STOPS, EpisodeRecord


@dataclass(frozen=True)
class RftFilter:
    """Which trajectories to keep; the defaults are the paper's. ``min_reward``: the reward must
    be above it (the episode's return; 0 keeps correct solutions). ``max_invalid_calls``,
    ``max_repeated_calls`` (a call that repeated an earlier one and got the same output: a loop
    that made no progress) and ``max_tool_errors``: at most that many; None: any number.
    ``stops``: the endings kept (None: any with a verdict, the turn and context limits included)."""

    min_reward: float = 0.0
    max_invalid_calls: int | None = 0
    max_repeated_calls: int | None = 0
    max_tool_errors: int | None = None
    stops: tuple[str, ...] | None = None

    def rejects(self, record: EpisodeRecord) -> str | None:
        """Why ``record`` is not kept, or None when it is."""
        if record.stop in UNDECIDED_STOPS or record.reward is None:
            return f"ended by {record.stop.replace('_', ' ')}"
        if self.stops is not None and record.stop not in self.stops:
            return f"ended by {record.stop.replace('_', ' ')}"
        if record.reward <= self.min_reward:
            return f"reward {record.reward:g} is not above {self.min_reward:g}"
        rollout = record.rollout or {}
        for name, limit, count in (("invalid calls", self.max_invalid_calls, record.invalid_calls),
                                   ("repeated calls", self.max_repeated_calls, rollout.get("repeated_calls")),
                                   ("tool errors", self.max_tool_errors, rollout.get("tool_errors"))):
            if limit is None:
                continue
            if count is None:
                return f"{name} not recorded (a record from before the rollout accounting)"
            if count > limit:
                return f"more than {limit} {name}"
        return None


@dataclass
class Exported:
    """What ``export`` did: the trajectories written, and the others counted by why they were dropped."""

    written: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


def trajectory(record: EpisodeRecord) -> dict:
    """One record as a chat trajectory: ``messages`` and ``tools`` first, then what filters read."""
    final = record.final or {}
    return {"messages": record.messages, "tools": record.tools, "task_id": record.task_id, "level": record.level,
            "language": record.language, "model": record.model, "reward": record.reward, "stop": record.stop,
            "turns": record.turns, "speedup_vs_eager": final.get("speedup_vs_eager"),
            "speedup_vs_compile": final.get("speedup_vs_compile"), "invalid_calls": record.invalid_calls,
            "tokens": record.tokens, "rollout": record.rollout}


def export(records: Iterable[EpisodeRecord], output: str | Path, keep: RftFilter = RftFilter()) -> Exported:
    """Write the records ``keep`` keeps to ``output`` (JSONL, one trajectory a line, replaced
    whole: written beside it, then moved over it); returns the counts."""
    output = Path(output)
    summary = Exported()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    with partial.open("w") as handle:
        for record in records:
            why = keep.rejects(record)
            if why is not None:
                summary.dropped[why] += 1
                continue
            handle.write(json.dumps(trajectory(record)) + "\n")
            summary.written += 1
    os.replace(partial, output)
    return summary
