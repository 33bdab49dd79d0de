"""The eval metrics and their renderers, on hand-made episode records (pure: no sandbox, no server).

Every expected number below is worked out by hand from the records of its test.
"""

from __future__ import annotations

import builtins
import json
import math
from pathlib import Path

import pytest

from kernel_env.workloads.analysis.metrics import (
    FAST_P,
    EpisodeRecord,
    RecordError,
    best_per_task,
    compute_metrics,
    geomean,
    group_metrics,
    read_records,
)
from kernel_env.workloads.analysis.report import (
    PlotUnavailable,
    markdown,
    plot_speedups,
    rich_report,
    speedups,
)
from kernel_env.workloads.analysis.trajectories import RftFilter, export


def rec(task: str, *, level: int | None = 1, correct: bool = True, eager: float | None = None,
        compile: float | None = None, reward: float | None = None, stop: str = "finished", calls: int = 10,
        invalid: int = 0, **extra) -> EpisodeRecord:
    """A record as `kernel-env eval` writes one; error records have no final evaluation, and
    evaluator-fault records one with no verdict and no reward."""
    final = None if stop == "error" else {"correct": correct, "speedup_vs_eager": eager, "speedup_vs_compile": compile}
    if stop == "evaluator_fault":
        final = {"correct": False, "fault": "evaluator"}
    if reward is None and stop not in ("error", "evaluator_fault"):
        reward = 1.0 if correct else -1.0
    return EpisodeRecord(task_id=task, level=level, stop=stop, final=final, reward=reward, tool_calls=calls,
                         invalid_calls=invalid, error="boom" if stop == "error" else None, **extra)


# ============================================================================ the figures of one group


def test_pass_faster_and_geomean_rates_are_over_all_tasks_and_geomeans_over_correct_ones():
    records = [rec("a", eager=2.0, compile=4.0), rec("b", eager=0.5, compile=0.25), rec("c", eager=1.0, compile=1.0),
               rec("d", correct=False, eager=8.0, compile=8.0)]
    g = group_metrics("L1", records)
    assert (g.tasks, g.episodes, g.passed, g.errors) == (4, 4, 3, 0)
    assert g.pass_rate == 0.75
    assert g.faster == {"eager": 0.25, "compile": 0.25}  # speed-up exactly 1.0 is not faster; d is wrong
    assert g.geomean["eager"] == pytest.approx(1.0)       # (2 · 0.5 · 1) ** (1/3); d's 8x does not count
    assert g.geomean["compile"] == pytest.approx(1.0)     # (4 · 0.25 · 1) ** (1/3)
    assert g.mean_reward == pytest.approx((1 + 1 + 1 - 1) / 4)


def test_fast_p_counts_correct_solutions_strictly_above_each_threshold():
    records = [rec("a", eager=0.5, compile=0.4), rec("b", eager=1.5, compile=1.0), rec("c", eager=2.5, compile=2.0),
               rec("d", correct=False, eager=9.0, compile=9.0), rec("e", eager=1.2, compile=None)]
    g = group_metrics("L1", records)
    assert list(g.fast_p["eager"]) == list(FAST_P)
    assert g.fast_p["eager"] == {0.0: 0.8, 0.5: 0.6, 1.0: 0.6, 1.5: 0.2, 2.0: 0.2}
    # e is correct but has no torch.compile time: it passes, and is never fast against compile.
    assert g.fast_p["compile"] == {0.0: 0.6, 0.5: 0.4, 1.0: 0.2, 1.5: 0.2, 2.0: 0.0}  # c's 2.0 is not above 2
    assert g.pass_rate == 0.8 and g.fast_p["eager"][0.0] == g.pass_rate
    assert g.geomean["compile"] == pytest.approx((0.4 * 1.0 * 2.0) ** (1 / 3))


def test_without_any_compile_time_the_vs_compile_figures_are_unknown_not_zero():
    g = group_metrics("L1", [rec("a", eager=2.0, compile=None), rec("b", correct=False)])
    assert g.faster == {"eager": 0.5, "compile": None}
    assert g.geomean == {"eager": 2.0, "compile": None}
    assert g.fast_p["compile"] is None and g.fast_p["eager"][1.5] == 0.5


def test_with_no_correct_solution_nothing_is_faster_and_geomeans_are_unknown():
    g = group_metrics("L2", [rec("a", correct=False), rec("b", correct=False, eager=3.0, compile=3.0)])
    assert g.pass_rate == 0.0 and g.faster == {"eager": 0.0, "compile": 0.0}
    assert g.geomean == {"eager": None, "compile": None}
    assert g.fast_p["eager"] == {p: 0.0 for p in FAST_P}
    assert g.mean_reward == -1.0


def test_impossible_speedups_count_as_unmeasured():
    bad = [0.0, -2.0, math.nan, math.inf, True]
    records = [rec(f"t{i}", eager=value, compile=2.0) for i, value in enumerate(bad)]
    g = group_metrics("L1", records)
    assert g.faster["eager"] is None and g.geomean["eager"] is None  # correct, but none honestly timed vs eager
    assert g.faster["compile"] == 1.0 and g.geomean["compile"] == pytest.approx(2.0)


def test_invalid_call_rate_is_over_every_tool_call_of_every_episode():
    records = [rec("a", calls=10, invalid=1), rec("a", calls=30, invalid=3, eager=2.0), rec("b", calls=0, invalid=0)]
    g = group_metrics("L1", records)
    assert g.episodes == 3 and g.tasks == 2
    assert g.invalid_call_rate == pytest.approx(4 / 40)
    assert group_metrics("L1", [rec("a", calls=0)]).invalid_call_rate is None


def test_an_episode_that_ended_in_error_is_a_task_that_did_not_pass():
    g = group_metrics("L1", [rec("a", eager=2.0), rec("b", stop="error"), rec("c", stop="error")])
    assert g.tasks == 3 and g.passed == 1 and g.errors == 2
    assert g.pass_rate == pytest.approx(1 / 3)
    assert g.mean_reward == 1.0  # an error has no reward: it is not averaged in as a made-up number


def test_an_evaluators_fault_is_counted_apart_and_pays_nothing():
    g = group_metrics("L1", [rec("a", eager=2.0), rec("b", stop="evaluator_fault"), rec("c", stop="error")])
    assert (g.tasks, g.passed, g.errors, g.evaluator_faults) == (3, 1, 1, 1)
    assert g.mean_reward == 1.0


def test_an_empty_group_has_no_rates():
    g = group_metrics("all", [])
    assert g.tasks == 0 and g.pass_rate is None and g.faster == {"eager": None, "compile": None}
    assert g.mean_reward is None and g.invalid_call_rate is None


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None


# ============================================================================ which record counts


def test_the_best_record_of_a_task_counts():
    wrong = rec("t", correct=False, eager=9.0, compile=9.0)
    slow = rec("t", eager=3.0, compile=0.8, reward=2.0)
    fast = rec("t", eager=1.5, compile=1.2, reward=3.0)
    assert best_per_task([wrong, slow, fast])["t"] is fast            # larger speed-up vs compile wins
    assert best_per_task([fast, slow, wrong])["t"] is fast
    assert best_per_task([wrong, slow])["t"] is slow                   # correct beats faster-but-wrong
    first, second = rec("u", eager=2.0, compile=2.0), rec("u", eager=2.0, compile=2.0)
    assert best_per_task([first, second])["u"] is first               # a tie keeps the earliest
    by_eager = rec("v", eager=3.0, compile=None)
    assert best_per_task([rec("v", eager=2.0, compile=None), by_eager])["v"] is by_eager  # then vs eager
    errored, failed = rec("w", stop="error"), rec("w", correct=False)
    assert best_per_task([errored, failed])["w"] is failed             # a finished episode beats an error
    g = group_metrics("L1", [wrong, slow, fast])
    assert g.tasks == 1 and g.episodes == 3 and g.geomean["compile"] == pytest.approx(1.2)


def test_overall_weighs_levels_by_their_number_of_problems():
    records = [rec(f"l1/{i}", level=1, eager=2.0, compile=2.0) for i in range(4)] + [rec("l2/0", level=2, correct=False)]
    metrics = compute_metrics(records)
    assert [g.group for g in metrics.levels] == ["L1", "L2"]
    assert metrics.levels[0].pass_rate == 1.0 and metrics.levels[1].pass_rate == 0.0
    assert metrics.overall.group == "all" and metrics.overall.tasks == 5
    assert metrics.overall.pass_rate == 0.8  # 4 of 5 tasks, not the mean of the level rates (0.5)


def test_levels_are_sorted_and_tasks_without_a_level_come_last():
    records = [rec("x", level=None), rec("c", level=3), rec("a", level=1), rec("b", level=2)]
    assert [g.group for g in compute_metrics(records).groups] == ["L1", "L2", "L3", "no level", "all"]


def test_metrics_as_json_name_the_fast_p_thresholds():
    data = compute_metrics([rec("a", eager=2.0, compile=None)]).to_dict()
    json.dumps(data)  # JSON-ready
    overall = data["overall"]
    assert overall["fast_p"]["eager"] == {"fast_0": 1.0, "fast_0.5": 1.0, "fast_1": 1.0, "fast_1.5": 1.0, "fast_2": 0.0}
    assert overall["fast_p"]["compile"] is None and data["levels"][0]["group"] == "L1"


# ============================================================================ run files


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_records_round_trip_through_a_run_file_unknown_keys_included(tmp_path):
    record = rec("a", eager=2.0, messages=[{"role": "user", "content": "hi"}], custom={"kept": True})
    path = write_lines(tmp_path / "run.jsonl", record.model_dump_json(), "", rec("b", stop="error").model_dump_json())
    read = read_records(path)
    assert [r.task_id for r in read] == ["a", "b"]
    assert read[0] == record and read[0].model_extra == {"custom": {"kept": True}}


def test_a_torn_last_line_is_ignored_but_a_bad_line_elsewhere_is_an_error(tmp_path):
    whole = rec("a").model_dump_json()
    torn = tmp_path / "torn.jsonl"
    torn.write_text(whole + "\n" + whole[:40])  # a run killed mid-write: no newline after the fragment
    assert [r.task_id for r in read_records(torn)] == ["a"]
    with pytest.raises(RecordError, match=r"line 2: not an episode record \(a torn record inside the file\)"):
        read_records(write_lines(tmp_path / "resumed.jsonl", whole, whole[:40], whole))
    with pytest.raises(RecordError, match=r"bad\.jsonl, line 1: not an episode record"):
        read_records(write_lines(tmp_path / "bad.jsonl", whole[:40], whole))
    with pytest.raises(RecordError, match=r"line 2: not an episode record \(stop: "):
        read_records(write_lines(tmp_path / "other.jsonl", whole, json.dumps({"task_id": "x", "stop": "maybe"})))
    with pytest.raises(RecordError, match="line 1: .*task_id"):
        read_records(write_lines(tmp_path / "traces.jsonl", json.dumps({"sample_key": "x"})))
    with pytest.raises(RecordError, match="cannot read it"):
        read_records(tmp_path / "missing.jsonl")


# ============================================================================ rendering


def test_markdown_tables_have_a_row_per_level_and_overall():
    records = [rec("a", level=1, eager=2.0, compile=0.5, reward=2.0), rec("b", level=2, correct=False, calls=4, invalid=1)]
    text = markdown(compute_metrics(records), title="model · cuda")
    lines = text.splitlines()
    assert lines[0] == "### model · cuda"
    main = [line for line in lines if line.startswith("| L") or line.startswith("| all")]
    assert main[0] == "| L1 | 1 | 100.0 % | 100.0 % | 0.0 % | 2.00x | 0.50x | 2.00 | 0.0 % | 0 | 0 |"
    assert main[1] == "| L2 | 1 | 0.0 % | 0.0 % | 0.0 % | — | — | -1.00 | 25.0 % | 0 | 0 |"
    assert main[2] == "| all | 2 | 50.0 % | 50.0 % | 0.0 % | 2.00x | 0.50x | 0.50 | 7.1 % | 0 | 0 |"
    assert "| all | torch.compile | 50.0 % | 0.0 % | 0.0 % | 0.0 % | 0.0 % |" in lines  # 0.5x is not above 0.5
    assert "| L1 | eager | 100.0 % | 100.0 % | 100.0 % | 100.0 % | 0.0 % |" in lines


def test_rich_report_renders_the_same_figures():
    from rich.console import Console

    console = Console(width=140, record=True)
    for part in rich_report(compute_metrics([rec("a", eager=2.0, compile=1.5)]), title="t"):
        console.print(part)
    text = console.export_text()
    assert "geomean vs compile" in text and "1.50x" in text and "fast_1.5" in text
    assert "faster than compile (>1x)" in text and "1.05x by default" in text  # the note says whose margin


def test_the_plot_shows_counted_correct_speedups_per_level(tmp_path):
    records = [rec("a", level=1, eager=2.0, compile=1.1), rec("a", level=1, eager=3.0, compile=0.9),
               rec("b", level=2, eager=0.5, compile=None), rec("c", level=2, correct=False, eager=5.0, compile=5.0)]
    assert speedups(records) == {"eager": {"L1": [2.0], "L2": [0.5]}, "compile": {"L1": [1.1]}}
    path = plot_speedups(records, tmp_path / "plots" / "speedups.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_plot_of_a_run_without_correct_solutions_still_draws(tmp_path):
    path = plot_speedups([rec("a", correct=False)], tmp_path / "empty.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_plot_says_how_to_get_it(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlotUnavailable, match=r"pip install 'kernel_env\[eval\]'"):
        plot_speedups([rec("a", eager=2.0)], tmp_path / "never.png")
    assert not (tmp_path / "never.png").exists()
    assert "| all | 1 | 100.0 %" in markdown(compute_metrics([rec("a", eager=2.0)]))  # the tables still work


def test_the_rft_filter_keeps_the_papers_trajectories_and_says_why_it_drops_the_others(tmp_path):
    def accounted(task: str, *, repeated: int = 0, errors: int = 0, **options) -> EpisodeRecord:
        record = rec(task, **options)
        record.rollout = {"repeated_calls": repeated, "tool_errors": errors}
        return record

    records = [
        accounted("kept"),
        accounted("wrong", correct=False),
        accounted("loop", repeated=2),
        accounted("clumsy", errors=3),  # tool errors are allowed unless a limit is set
        rec("old"),  # no rollout accounting: its loops cannot be told
        accounted("fault", stop="evaluator_fault"),
        accounted("invalid", invalid=1),
    ]
    output = tmp_path / "rft.jsonl"
    done = export(records, output)
    assert [json.loads(line)["task_id"] for line in output.read_text().splitlines()] == ["kept", "clumsy"]
    assert done.written == 2 and done.dropped == {
        "reward -1 is not above 0": 1, "more than 0 repeated calls": 1, "ended by evaluator fault": 1,
        "repeated calls not recorded (a record from before the rollout accounting)": 1, "more than 0 invalid calls": 1}
    lenient = RftFilter(min_reward=-2, max_repeated_calls=None, max_invalid_calls=None, max_tool_errors=0)
    assert [r.task_id for r in records if lenient.rejects(r) is None] == ["kept", "wrong", "loop", "invalid"]
