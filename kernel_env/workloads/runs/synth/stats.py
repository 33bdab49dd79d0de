"""Statistics of a task set like the paper's Table 3: the share of 1- … 5-operator compositions
and of standalone transformers tasks.

A task's category comes from its metadata, as the loaders keep it: ``data_source`` in the
Ops-6K form (``torch#2``, ``transformers#1``; the synthesis output writes it too), else the
length of its ``ops`` list. Tasks with neither (a KernelBench problem, say) are counted as
``unknown``, apart from the shares.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from kernel_env.tasks import Task

CATEGORIES = ("1 op", "2 ops", "3 ops", "4 ops", "5 ops", "transformers")
#: CUDA-Agent-Ops-6K's final mix (the paper's Table 3), in percent.
PAPER_SHARES = {"1 op": 3.40, "2 ops": 83.77, "3 ops": 7.62, "4 ops": 2.80, "5 ops": 1.23, "transformers": 1.18}


def category(task: Task) -> str | None:
    """The task's Table 3 category, or None if its metadata does not say (no data_source, no ops)."""
    source = task.metadata.get("data_source")
    if isinstance(source, str):
        match = re.fullmatch(r"\s*(\w+)\s*#\s*(\d+)\s*", source)
        if match:
            library, count = match.group(1).lower(), int(match.group(2))
            if library == "transformers":
                return "transformers"
            return _ops_category(count)
    ops = task.metadata.get("ops")
    if isinstance(ops, str):  # some exports store the list as text
        ops = [op for op in re.split(r"[\s,;\[\]'\"]+", ops) if op]
    if isinstance(ops, list) and ops:
        return _ops_category(len(ops))
    return None


def _ops_category(count: int) -> str | None:
    return f"{count} op{'s' if count != 1 else ''}" if 1 <= count <= 5 else None


@dataclass(frozen=True)
class CompositionStats:
    """Counts per category; ``unknown`` tasks had no category and are not part of the shares."""

    counts: dict[str, int]
    unknown: int

    @property
    def known(self) -> int:
        return sum(self.counts.values())

    def share(self, name: str) -> float:
        """Percent of the categorised tasks."""
        return 100.0 * self.counts.get(name, 0) / self.known if self.known else 0.0

    def rows(self) -> list[dict]:
        """One row per category: count, share (percent) and the paper's share."""
        return [{"category": name, "count": self.counts.get(name, 0), "share": round(self.share(name), 2),
                 "paper_share": PAPER_SHARES[name]} for name in CATEGORIES]

    def to_record(self) -> dict:
        return {"total": self.known + self.unknown, "categorised": self.known, "unknown": self.unknown,
                "rows": self.rows()}


def composition_stats(tasks: Iterable[Task]) -> CompositionStats:
    """Count a task set's categories (Table 3 of the paper)."""
    counts: Counter[str] = Counter()
    unknown = 0
    for task in tasks:
        found = category(task)
        if found is None:
            unknown += 1
        else:
            counts[found] += 1
    return CompositionStats(counts={name: counts[name] for name in CATEGORIES}, unknown=unknown)
