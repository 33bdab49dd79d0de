"""Renderers of an eval run's metrics: markdown (for papers and READMEs), a rich table (for the
terminal), JSON (``Metrics.to_dict()``), and a PNG of the speed-up distribution.

They render what ``kernel_env.workloads.analysis.metrics`` computed and decide nothing. The plot needs matplotlib
(``pip install 'kernel_env[eval]'``); without it ``plot_speedups`` raises ``PlotUnavailable`` with
that advice, and everything else works.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kernel_env.evaluators.records import EvalSettings
from kernel_env.workloads.analysis.metrics import (
    BASELINES,
    FAST_P,
    EpisodeRecord,
    GroupMetrics,
    Metrics,
    best_per_task,
    geomean,
    level_name,
)

BASELINE_LABELS = {"eager": "eager", "compile": "torch.compile"}


class PlotUnavailable(RuntimeError):
    """The plot cannot be drawn here (matplotlib is missing); the message says how to get it."""


# ============================================================================ cells


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def times(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _main_columns() -> list[tuple[str, Callable[[GroupMetrics], str]]]:
    """The main figures: (label, cell of a group). Markdown makes them columns, the terminal rows."""
    return [
        ("tasks", lambda g: str(g.tasks)),
        ("pass", lambda g: percent(g.pass_rate)),
        ("faster than eager (>1x)", lambda g: percent(g.faster["eager"])),
        ("faster than compile (>1x)", lambda g: percent(g.faster["compile"])),
        ("geomean vs eager", lambda g: times(g.geomean["eager"])),
        ("geomean vs compile", lambda g: times(g.geomean["compile"])),
        ("mean reward", lambda g: number(g.mean_reward)),
        ("invalid calls", lambda g: percent(g.invalid_call_rate)),
        ("errors", lambda g: str(g.errors)),
        ("evaluator faults", lambda g: str(g.evaluator_faults)),
    ]


def _fast_p_rows(metrics: Metrics) -> list[list[str]]:
    rows = []
    for group in metrics.groups:
        for baseline in BASELINES:
            table = group.fast_p[baseline]
            rows.append([group.group, BASELINE_LABELS[baseline],
                         *(percent(None if table is None else table[p]) for p in FAST_P)])
    return rows


FAST_P_HEADERS = ["level", "vs", *(f"fast_{p:g}" for p in FAST_P)]


# ============================================================================ markdown and rich


def describe(records: Iterable[EpisodeRecord]) -> str:
    """A title for a run's tables: the model(s), language(s) and device(s) of its records."""
    records = list(records)

    def values(name: str) -> str:
        found = sorted({str(getattr(record, name)) for record in records if getattr(record, name)})
        return ", ".join(found) or "?"

    tasks = len({record.task_id for record in records})
    return (f"{values('model')} · {values('language')} on {values('device')} · {tasks} task{'s' if tasks != 1 else ''}, "
            f"{len(records)} episode{'s' if len(records) != 1 else ''}")



def markdown(metrics: Metrics, *, title: str | None = None) -> str:
    """Two markdown tables (the main figures, then fast_p), with a line on what counts."""
    columns = _main_columns()
    lines = [f"### {title}", ""] if title else []
    lines += _markdown_table(["level", *(label for label, _ in columns)],
                             [[group.group, *(cell(group) for _, cell in columns)] for group in metrics.groups])
    lines += ["", *_markdown_table(FAST_P_HEADERS, _fast_p_rows(metrics))]
    lines += ["", NOTE]
    return "\n".join(lines) + "\n"


NOTE = ("Per task the best episode counts (correct, then the largest speed-up vs torch.compile). Rates are over "
        "all tasks of a level; geomeans over its correct solutions. Faster (>1x) and fast_p: correct with a speed-up "
        "above 1 (or p), as KernelBench and the CUDA Agent paper count them; the reward's milestones need more than "
        f"1 + the speed-up margin ({1 + EvalSettings().speedup_margin:g}x by default: reward 2 beats eager by it, 3 "
        "both baselines), so a solution counted faster here can still earn reward 1 or 2. "
        "Invalid calls: the share of the model's tool calls that could not be run as given. "
        "Errors: tasks whose episode ended in error (no final evaluation). Evaluator faults: tasks whose final "
        "evaluation failed by the evaluator's fault (no reward).")


def _markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    aligns = [":---" if i == 0 else "---:" for i in range(len(headers))]
    return ["| " + " | ".join(row) + " |" for row in (headers, aligns, *rows)]


def rich_report(metrics: Metrics, *, title: str | None = None) -> list[RenderableType]:
    """The same figures for a terminal, within 80 columns: the title, the main table turned so
    each level is a column (numbers are never cut; a long label wraps first), the fast_p table,
    then the note. Print each with a console; titles and the note are lines of their own, so
    that they wrap (or, in a log, do not) like any other line."""
    columns = _main_columns()
    main = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold", padding=(0, 1, 0, 0))
    main.add_column("", justify="left")
    for group in metrics.groups:
        main.add_column(group.group, justify="right", no_wrap=True,
                        header_style="bold" if group is metrics.overall else "")
    for label, cell in columns:
        main.add_row(label, *(cell(group) for group in metrics.groups))
    fast = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold", padding=(0, 1, 0, 0))
    for index, header in enumerate(FAST_P_HEADERS):
        fast.add_column(header, justify="left" if index < 2 else "right", no_wrap=True)
    for row in _fast_p_rows(metrics):
        fast.add_row(*row)
    return [*([Text(title, style="bold")] if title else []), main,
            Text("fast_p: correct with speed-up > p", style="bold"), fast, Text(NOTE, style="dim")]


# ============================================================================ the plot


def speedups(records: Iterable[EpisodeRecord]) -> dict[str, dict[str, list[float]]]:
    """baseline → level name → the speed-ups of the counted correct solutions (what the plot shows)."""
    found: dict[str, dict[str, list[float]]] = {baseline: {} for baseline in BASELINES}
    counted = sorted(best_per_task(records).values(), key=lambda r: (r.level is None, r.level or 0))
    for record in counted:
        if not record.correct:
            continue
        for baseline in BASELINES:
            value = record.speedup(baseline)
            if value is not None:
                found[baseline].setdefault(level_name(record.level), []).append(value)
    return found


def plot_speedups(records: Iterable[EpisodeRecord], path: str | Path, *, title: str = "") -> Path:
    """Histograms of the correct solutions' speed-ups vs eager and vs torch.compile (log scale,
    1.0 marked, geomean marked, stacked by level), saved as a PNG at ``path``. Raises
    PlotUnavailable without matplotlib; OSError if the file cannot be written."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a window, works without a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("the speed-up plot needs matplotlib: pip install 'kernel_env[eval]'") from None
    data = speedups(records)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    try:
        for axis, baseline in zip(axes, BASELINES):
            _histogram(axis, data[baseline], BASELINE_LABELS[baseline])
        if title:
            figure.suptitle(title)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
    return path


def _histogram(axis, by_level: dict[str, list[float]], label: str) -> None:
    values = [value for level in by_level.values() for value in level]
    axis.set_title(f"speed-up vs {label}  (n = {len(values)})")
    axis.set_xscale("log")
    axis.set_xlabel(f"speed-up vs {label} (log scale; > 1 is faster)")
    axis.set_ylabel("tasks")
    if not values:
        axis.text(0.5, 0.5, f"no correct solution timed against {label}", ha="center", va="center",
                  transform=axis.transAxes, color="gray")
        axis.set_xlim(0.1, 10)
        axis.set_yticks([])
        axis.axvline(1.0, color="black", linestyle="--", linewidth=1)
        _log_ticks(axis, 0.1, 10)
        return
    low, high = min(values + [1.0]) / 1.25, max(values + [1.0]) * 1.25
    edges = [low * (high / low) ** (i / 24) for i in range(25)]
    axis.hist(list(by_level.values()), bins=edges, stacked=True, label=list(by_level), edgecolor="white", linewidth=0.5)
    axis.axvline(1.0, color="black", linestyle="--", linewidth=1, label="1.0 (as fast)")
    mean = geomean(values)
    axis.axvline(mean, color="crimson", linewidth=1.5, label=f"geomean {mean:.2f}x")
    faster = sum(value > 1.0 for value in values)
    axis.text(0.98, 0.97, f"{faster}/{len(values)} faster", ha="right", va="top", transform=axis.transAxes)
    axis.set_xlim(low, high)
    axis.yaxis.get_major_locator().set_params(integer=True)
    axis.legend(loc="best", fontsize="small", framealpha=0.9)
    _log_ticks(axis, low, high)


def _log_ticks(axis, low: float, high: float) -> None:
    """Readable ticks (0.5x, 1x, 2x, ...) instead of powers of ten on a narrow log axis."""
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low <= t <= high]
    if len(ticks) < 3:  # a narrow range: finer steps around 1
        ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4) if low <= t <= high]
    if len(ticks) < 3:
        step = (math.log(high) - math.log(low)) / 4
        ticks = [math.exp(math.log(low) + step * i) for i in range(1, 4)]
    axis.set_xticks(ticks)
    axis.set_xticklabels([f"{t:.3g}x" for t in ticks])
    axis.minorticks_off()
