"""The journal every resumable run keeps (kernel_env.workloads.runs.journal): a record is on disk when
``append`` returns, a crash's torn last line is left out by ``read`` and cut before the next
append, and a file that is not a journal is refused and left as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kernel_env.workloads.runs import journal as journal_module
from kernel_env.workloads.runs.journal import Journal, JournalError

A = {"sample_key": "a", "turns": [1, 2]}
B = {"sample_key": "b", "text": "café"}


def lines(path) -> list[str]:
    return path.read_text().splitlines()


def records(journal: Journal) -> list[dict]:
    return [entry.record for entry in journal.read()]


def test_a_resumed_journal_appends_after_what_was_there(tmp_path):
    path = tmp_path / "deep" / "run.jsonl"
    first = Journal(path)
    first.append(A)
    first.append(json.dumps(B))  # a record already serialised (a pydantic model's JSON) is written as given
    before = path.read_bytes()
    resumed = Journal(path)
    assert records(resumed) == [A, B] and not resumed.torn and resumed.skipped == []
    resumed.append({"sample_key": "c"})
    assert path.read_bytes().startswith(before)
    assert [json.loads(line)["sample_key"] for line in lines(path)] == ["a", "b", "c"]
    assert [entry.line for entry in resumed.read()] == [1, 2, 3]


def test_a_torn_last_line_is_left_out_by_read_and_cut_before_the_next_append(tmp_path, caplog):
    path = tmp_path / "run.jsonl"
    whole = json.dumps(A) + "\n"
    path.write_text(whole + json.dumps(B)[:12])  # a crash mid-append: its record never finished
    journal = Journal(path)
    assert records(journal) == [A] and journal.torn
    assert path.read_text() == whole + json.dumps(B)[:12], "read changed the file"
    journal.append(B)
    assert path.read_text() == whole + json.dumps(B) + "\n" and "cut a torn last line" in caplog.text
    assert records(Journal(path)) == [A, B]


def test_a_whole_last_record_that_lost_its_newline_is_kept_and_its_line_ended(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(A))
    journal = Journal(path)
    assert records(journal) == [A] and not journal.torn
    journal.create()
    assert path.read_text() == json.dumps(A) + "\n"
    journal.append(B)
    assert records(Journal(path)) == [A, B]


@pytest.mark.parametrize("tail", [
    b'{"sample_key": "b", "tur',                         # cut inside the record
    '{"sample_key": "b", "text": "é'.encode()[:-1],      # cut inside a character
    b"\0" * 37,                                          # what a power loss can leave where the write was
    b'{"sample_key": "b"}\0\0',                          # a record whose end is zeros is not whole
], ids=["prefix", "inside-a-character", "zeros", "record-then-zeros"])
def test_what_a_crash_leaves_after_the_last_newline_is_a_torn_line(tmp_path, tail):
    path = tmp_path / "run.jsonl"
    path.write_bytes(json.dumps(A).encode() + b"\n" + tail)
    journal = Journal(path)
    assert records(journal) == [A] and journal.torn
    journal.repair()
    assert path.read_text() == json.dumps(A) + "\n" and not journal.torn


def test_a_torn_line_longer_than_one_read_is_cut_where_it_starts(tmp_path):
    path = tmp_path / "run.jsonl"
    big = {"sample_key": "big", "text": "x" * (3 * journal_module._CHUNK)}
    path.write_text(json.dumps(A) + "\n" + json.dumps(big)[:-5])
    Journal(path).repair()
    assert path.read_text() == json.dumps(A) + "\n"
    path.write_text(json.dumps(big)[:-5])  # the only line, torn
    Journal(path).repair()
    assert path.read_bytes() == b""


def test_a_torn_line_an_earlier_run_kept_inside_the_file_is_skipped(tmp_path, caplog):
    """What `kernel-env synth` left before the journal module: it kept a torn line and began a new one."""
    path = tmp_path / "verdicts.jsonl"
    path.write_text(json.dumps(A) + "\n" + '{"index": 99, "sta' + "\n\n" + json.dumps(B) + "\n")
    journal = Journal(path)
    assert records(journal) == [A, B] and journal.skipped == [2] and not journal.torn
    assert "line 2: skipped a torn record" in caplog.text
    journal.append({"sample_key": "c"})
    assert lines(path)[-1] == '{"sample_key": "c"}' and lines(path)[1] == '{"index": 99, "sta'


@pytest.mark.parametrize("content, line, why", [
    ("hello", 1, "not JSON"),
    ('{"a": 1}\n[{"sample_key": "x"}]\n', 2, "an array, not a JSON object"),
    ('{\n  "a": 1\n}', 2, "not JSON"),
    ('{"a": 1}\n"text"', 2, "a string, not a JSON object"),
])
def test_a_file_that_is_not_a_journal_is_refused_and_left_as_it_is(tmp_path, content, line, why):
    path = tmp_path / "notes.txt"
    path.write_text(content)
    journal = Journal(path)
    with pytest.raises(JournalError, match=f"line {line}: not a journal record \\({why}\\)") as raised:
        journal.read()
    assert (raised.value.line, raised.value.why) == (line, why)
    if not content.endswith("\n"):  # only the last line is read before an append: it is not a record either
        with pytest.raises(JournalError, match=f"line {content.count(chr(10)) + 1}: not a journal record"):
            journal.append(A)
    assert path.read_text() == content


@pytest.mark.parametrize("record", ['{"a": 1}\n{"b": 2}', "[1, 2]", ""])
def test_append_takes_one_json_object_on_one_line(tmp_path, record):
    path = tmp_path / "run.jsonl"
    with pytest.raises(ValueError, match="one JSON object on one line"):
        Journal(path).append(record)
    assert not path.exists()


def test_create_makes_the_file_with_the_umasks_mode_and_a_missing_file_reads_empty(tmp_path):
    path = tmp_path / "out" / "run.jsonl"
    journal = Journal(path)
    assert journal.read() == [] and not path.exists()
    umask = os.umask(0o027)
    try:
        journal.create()
    finally:
        os.umask(umask)
    assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o640


def _child(script: str, path) -> subprocess.CompletedProcess:
    code = "import os, sys\nfrom kernel_env.workloads.runs.journal import Journal\njournal = Journal(sys.argv[1])\n"
    return subprocess.run([sys.executable, "-c", code + textwrap.dedent(script), str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_record_survives_the_process_being_killed_right_after_append_returns(tmp_path):
    """os._exit skips every flush Python would do at exit: what is on file was written by append
    itself. (A process's death cannot test the fsync: the page cache outlives it.)"""
    path = tmp_path / "run.jsonl"
    Journal(path).append(A)
    child = _child("""
        journal.append({"sample_key": "b", "text": "café"})
        os._exit(9)
    """, path)
    assert child.returncode == 9, child.stderr
    assert records(Journal(path)) == [A, B]


def test_a_process_killed_inside_append_leaves_a_torn_line_the_next_run_cuts(tmp_path):
    path = tmp_path / "run.jsonl"
    Journal(path).append(A)
    child = _child("""
        write = os.write
        def torn_write(fd, data):  # half the line reaches the file, then the process dies
            write(fd, bytes(data[:len(data) // 2]))
            os._exit(9)
        os.write = torn_write
        journal.append({"sample_key": "b", "text": "x" * 1000})
    """, path)
    assert child.returncode == 9, child.stderr
    assert not path.read_text().endswith("\n")
    resumed = Journal(path)
    assert records(resumed) == [A] and resumed.torn
    resumed.append(B)
    assert records(Journal(path)) == [A, B] and path.read_text().count("\n") == 2


# ============================================================================ every run keeps the one rule


def test_every_run_cuts_a_torn_last_line_before_its_next_record(tmp_path):
    """The rule was each run's own (eval cut the torn line; generate ignored it and could glue its
    next trace onto it; synth kept it and began a new line): now it is the journal's, for all."""
    from kernel_env.workloads.runs.agent_eval import RunFile
    from kernel_env.workloads.runs.generate import TraceStore
    from kernel_env.workloads.analysis.metrics import EpisodeRecord
    from kernel_env.workloads.runs.synth.pipeline import Verdict, _State

    torn = '{"sample_key": "x", "tur'
    run = tmp_path / "run.jsonl"
    run.write_text(torn)
    RunFile(run).open().append(EpisodeRecord(task_id="a", stop="finished"))
    assert [json.loads(line)["task_id"] for line in lines(run)] == ["a"]

    store = TraceStore(tmp_path / "traces.json", fold_every=100)
    store.journal.path.write_text(torn)
    store.open()
    store.add({"sample_key": "a", "turns": []})
    assert lines(store.journal.path) == ['{"sample_key": "a", "turns": []}']

    work = tmp_path / "work"
    work.mkdir()
    kept = json.dumps(Verdict(0, "filter", True).to_record())
    (work / "verdicts.jsonl").write_text(kept + "\n" + torn)
    state = _State(work, {"version": 1}, restart=False)
    assert list(state.verdicts) == [0] and lines(work / "verdicts.jsonl") == [kept]
    state.add_verdict(Verdict(1, "compose", False, ["composing failed: x"]))
    assert [json.loads(line)["index"] for line in lines(work / "verdicts.jsonl")] == [0, 1]
