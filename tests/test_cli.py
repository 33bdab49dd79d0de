"""The kernel-env command line: tasks, doctor, run-task; exit codes 0 ok, 1 task failed, 2 usage/environment."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support import TINY_TASK, bubblewrap_skip_reason
from kernel_env.cli import app
from kernel_env.resources import example_dir
from kernel_env.sandbox.local import bubblewrap_problem

runner = CliRunner()


def _kernelbench(root: Path) -> Path:
    for level, stem in ((1, "1_Foo"), (1, "2_Baz"), (1, "3_FooBar"), (2, "12_Bar"), (2, "13_Qux")):
        (root / f"level{level}").mkdir(parents=True, exist_ok=True)
        (root / f"level{level}" / f"{stem}.py").write_text(TINY_TASK)
    return root


def _ids(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [record["id"] for record in json.loads(result.stdout)]


# ----------------------------------------------------------------------------- tasks


def test_tasks_lists_the_bundled_examples_with_their_hashes():
    from kernel_env.tasks import resolve_task

    result = runner.invoke(app, ["tasks", "examples"])
    assert result.exit_code == 0, result.output
    assert "example/relu_add" in result.stdout and resolve_task("example/relu_add").hash in result.stdout
    assert "relu_add" in result.stdout


def test_tasks_json_gives_one_record_per_task_without_code(tmp_path):
    result = runner.invoke(app, ["tasks", str(_kernelbench(tmp_path)), "--json"])
    records = json.loads(result.stdout)
    assert [r["id"] for r in records] == ["kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L1/3",
                                          "kernelbench/L2/12", "kernelbench/L2/13"]
    assert set(records[0]) == {"id", "source", "name", "level", "problem_id", "hash"}
    assert (records[3]["level"], records[3]["name"], records[3]["problem_id"]) == (2, "Bar", 12)


def test_tasks_filters_by_level_name_and_count(tmp_path):
    root = str(_kernelbench(tmp_path))
    assert _ids(runner.invoke(app, ["tasks", root, "--level", "2", "--json"])) == ["kernelbench/L2/12", "kernelbench/L2/13"]
    assert _ids(runner.invoke(app, ["tasks", root, "--name", "foo", "--json"])) == ["kernelbench/L1/1", "kernelbench/L1/3"]
    assert _ids(runner.invoke(app, ["tasks", root, "--count", "2", "--json"])) == ["kernelbench/L1/1", "kernelbench/L1/2"]


def test_tasks_sample_is_reproducible_with_a_seed(tmp_path):
    root = str(_kernelbench(tmp_path))
    first = _ids(runner.invoke(app, ["tasks", root, "--sample", "3", "--seed", "7", "--json"]))
    again = _ids(runner.invoke(app, ["tasks", root, "--sample", "3", "--seed", "7", "--json"]))
    assert first == again and len(first) == 3 and len(set(first)) == 3
    seeds = {tuple(_ids(runner.invoke(app, ["tasks", root, "--sample", "3", "--seed", str(s), "--json"]))) for s in range(8)}
    assert len(seeds) > 1


def test_tasks_check_shows_the_error_line_of_a_bad_task_and_exits_1(tmp_path):
    path = tmp_path / "mixed.jsonl"
    bad = TINY_TASK.replace("    return [torch.randn(8, 16)]", "    raise RuntimeError('shape unknown')")
    path.write_text(json.dumps({"id": "mine/good", "code": TINY_TASK}) + "\n" + json.dumps({"id": "mine/bad", "code": bad}) + "\n")
    result = runner.invoke(app, ["tasks", str(path), "--check"])
    assert result.exit_code == 1, result.output
    line = bad.splitlines().index("    raise RuntimeError('shape unknown')") + 1
    assert f"task mine/bad: get_inputs() raised RuntimeError: shape unknown (line {line} of the task)" in result.stdout
    assert "2 tasks: 1 ok, 1 bad" in result.stdout


def test_tasks_check_json_reports_signatures(tmp_path):
    path = tmp_path / "7_Tiny.py"
    path.write_text(TINY_TASK)
    result = runner.invoke(app, ["tasks", str(path), "--check", "--json"])
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.stdout)
    assert record["ok"] is True and record["error"] is None
    assert record["outputs"] == [{"shape": [8, 16], "dtype": "float32"}]


@pytest.mark.slow  # 5.5 s: two task checks
def test_tasks_check_lists_a_task_a_trivial_answer_passes_and_allow_trivial_takes_it(tmp_path):
    path = tmp_path / "ones.jsonl"
    ones = TINY_TASK.replace("return torch.relu(x) * self.scale", "return torch.softmax(x, dim=1).sum(dim=1)")
    assert ones != TINY_TASK
    path.write_text(json.dumps({"id": "mine/ones", "code": ones}) + "\n")
    refused = runner.invoke(app, ["tasks", str(path), "--check"])
    assert refused.exit_code == 1, refused.output
    assert "task mine/ones: refused, a trivial answer passes it: returning the constant 1 as the output passes every trial" \
        in refused.stdout
    taken = runner.invoke(app, ["tasks", str(path), "--check", "--allow-trivial", "--json"])
    assert taken.exit_code == 0, taken.output
    (record,) = json.loads(taken.stdout)
    assert record["ok"] and record["screened"] and record["trivial"] == ["returning the constant 1 as the output passes every trial"]


def test_tasks_of_a_missing_source_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["tasks", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such file or folder" in result.stderr


def test_tasks_of_a_source_holding_a_malformed_task_exits_1_with_one_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(TINY_TASK + "def oops(:\n")
    result = runner.invoke(app, ["tasks", str(path)])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: task file/broken: syntax error at line {TINY_TASK.count(chr(10)) + 1}: invalid syntax"


# ----------------------------------------------------------------------------- doctor


@pytest.mark.slow  # 123 s: a real grade of the example, end to end (asked for: doctor does not grade by default)
def test_doctor_json_reports_the_machine_and_what_it_means():
    result = runner.invoke(app, ["doctor", "--grade", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    facts = report["facts"]
    assert {"python", "torch", "triton", "nvidia_smi", "nvcc", "bubblewrap", "evaluation_children", "cgroup", "ninja", "g++",
            "ripgrep", "docker"} <= set(facts)
    assert facts["python"]["version"] == sys.version.split()[0]
    assert facts["bubblewrap"]["works"] == (bubblewrap_problem() is None)
    assert facts["evaluation_children"] == {"works": True, "isolated": bubblewrap_problem() is None, "problem": None}
    assert report["ok"] is True and report["missing"] == []
    assert facts["grade"]["correct"] and facts["grade"]["fault"] is None, facts["grade"]  # a real grade, end to end
    gpu_line = report["meaning"][0]
    if facts["torch"]["gpus"]:
        assert "can be evaluated" in gpu_line
    else:
        assert gpu_line.startswith("no GPU:") and "cpp and triton (interpreter) run on the CPU" in gpu_line
    assert any("sandbox" in line for line in report["meaning"])


@pytest.mark.parametrize("flags", [[], ["--no-grade"]])
def test_doctor_prints_a_table_and_its_meaning_without_grading_by_default(flags):
    started = time.monotonic()
    result = runner.invoke(app, ["doctor", *flags])
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 30  # the probes alone: about 6 s on a 2-core machine; a grade is minutes
    assert "example/relu_add" not in result.stdout  # no grading row ("grading  example/relu_add (cpp, cpu): ...")
    assert "grading was not checked: `kernel-env doctor --grade`" in " ".join(result.stdout.split())
    for word in ("python", "torch", "nvcc", "bubblewrap", "evaluation", "ripgrep", "What this means"):
        assert word in result.stdout
    assert re.fullmatch(r"\[ +0\.\d s\] probing this machine\n", result.stderr), result.stderr  # what it does, in a log


# ----------------------------------------------------------------------------- run-task


def _cli(*args: str, home: Path, columns: int | None = 200, **kwargs) -> subprocess.CompletedProcess:
    """The CLI in a child process, its output piped (no terminal); ``columns`` None leaves COLUMNS unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TTY_COMPATIBLE", "FORCE_COLOR")}
    env.update(KERNEL_ENV_HOME=str(home), **({"COLUMNS": str(columns)} if columns else {}))
    return subprocess.run([sys.executable, "-m", "kernel_env.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120, **kwargs)


def test_the_module_entry_point_runs():
    result = _cli("--version", home=Path("/nonexistent"))
    assert result.returncode == 0 and result.stdout.startswith("kernel-env ")


def test_run_task_without_a_terminal_says_so_and_exits_2(tmp_path):
    result = _cli("run-task", "example/relu_add", "--language", "cpp", home=tmp_path, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert "needs a terminal, but stdin is not one" in result.stderr
    assert not (tmp_path / "workspaces").exists(), "a workspace was left behind"


def test_run_task_with_an_unknown_task_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["run-task", "example/nope"])
    assert result.exit_code == 2
    assert "task example/nope: no such bundled example (known: relu_add" in result.stderr


def test_run_task_takes_every_task_path_the_loaders_take(monkeypatch):
    """`tasks examples/relu_add/task.py` lists it, so `run-task` takes it (here it goes on to say
    it needs a terminal); a path that names nothing says so."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    listed = runner.invoke(app, ["tasks", "examples/relu_add/task.py"])
    assert listed.exit_code == 0, listed.output
    taken = runner.invoke(app, ["run-task", "examples/relu_add/task.py", "--language", "cpp"])
    assert taken.exit_code == 2 and "needs a terminal" in taken.stderr, taken.output
    missing = runner.invoke(app, ["run-task", "nope.py"])
    assert missing.exit_code == 2 and "task nope.py: no such file" in missing.stderr, missing.output


def test_the_language_options_default_to_the_machine():
    """No command advertises a fixed language: without --language, the machine decides (cuda on a
    GPU, cpp on the CPU: kernel_env.runtime.episode.language_and_device)."""
    import typer.main

    commands = typer.main.get_command(app).commands
    for name in ("eval", "openhands", "run-task", "generate"):
        (language,) = [p for p in commands[name].params if p.name == "language"]
        assert language.default is None and "default: cuda with a GPU, else cpp" in language.help, name


def test_run_task_json_needs_solution_mode():
    result = runner.invoke(app, ["run-task", "example/relu_add", "--json"])
    assert result.exit_code == 2 and "--json belongs to solution mode" in result.stderr


def test_run_task_rejects_an_unknown_language():
    result = runner.invoke(app, ["run-task", "example/relu_add", "--language", "fortran"])
    assert result.exit_code == 2


def _readme_json_fields() -> list[str]:
    """The fields README.md lists for `run-task --json` (its bullet list after "one JSON object with these fields")."""
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "one JSON object with these fields" in line)
    bullets = []
    for line in lines[start + 1:]:
        if line.startswith("- "):
            bullets.append(line)
        elif line.startswith("  ") and bullets:
            continue  # a bullet's continuation
        elif bullets:
            break
    return [name for bullet in bullets for name in re.findall(r"`(\w+)`", bullet.split(":")[0])]


def test_run_task_json_of_a_failed_build_says_it_did_not_build_and_readme_lists_every_field(tmp_path):
    """A build failure (here a syntax error: no evaluation runs) says so in the summary line and in --json,
    whose every field README.md lists and explains."""
    task = tmp_path / "relu_add_4k.py"
    task.write_text((example_dir("relu_add") / "task.py").read_text().replace("1 << 24", "1 << 12"))
    solution = tmp_path / "broken"
    solution.mkdir()
    (solution / "model_new.py").write_text("import torch\nclass ModelNew(:\n")
    args = ("run-task", str(task), "--solution", str(solution), "--language", "triton", "--device", "cpu")
    result = _cli(*args, "--json", home=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["verdict"] == "did not build" and record["build_ok"] is False and record["compiled"] is False
    assert record["error"].startswith("`bash utils/compile.sh` failed (exit code 1)") and "invalid syntax" in record["error"]
    assert record["reward"] == -1 and record["fault"] == "candidate"
    assert re.search(r"done in [\d.]+ s: did not build, reward -1 \(", result.stderr), result.stderr
    listed = _readme_json_fields()
    assert sorted(listed) == sorted(record), f"README lists {sorted(listed)}; --json has {sorted(record)}"
    assert len(listed) == len(set(listed)), listed
    plain = _cli(*args, home=tmp_path)  # without --json: the same summary line
    assert plain.returncode == 1 and re.search(r"done in [\d.]+ s: did not build, reward -1 \(", plain.stderr), plain.stderr


@pytest.mark.parametrize("trials, violations, verdict, error", [
    ([(True, ""), (False, "output: 3 of 4096 elements outside atol=0.01, rtol=0.01; max abs error 5.2")], [],
     "wrong answer", "wrong answer in trial 2: output: 3 of 4096 elements outside atol=0.01, rtol=0.01; max abs error 5.2"),
    ([(True, "")], ["ModelNew.forward launched no Triton kernel"],
     "broke a rule", "rule violation: ModelNew.forward launched no Triton kernel"),
    ([(False, "output: shape (4,) expected (8,)")], ["torch computes inside ModelNew.forward (relu x1)"],
     "wrong answer", ("wrong answer in trial 1: output: shape (4,) expected (8,); "
                      "rule violation: torch computes inside ModelNew.forward (relu x1)")),
], ids=["a wrong trial", "a rule broken", "both"])
def test_run_task_json_of_a_wrong_answer_says_why_in_error(monkeypatch, tmp_path, trials, violations, verdict, error):
    """The evaluation's own record of a wrong answer has no error (its trials and violations say why):
    --json's error says it, and the summary line names the verdict. The evaluation here is the
    harness's record of one, made by hand (the real one: test_run_task_json_of_a_real_wrong_answer)."""
    from kernel_env.evaluators.records import EvalResult, Mode, TrialReport
    from kernel_env.runtime.episode import Episode
    from kernel_env.sandbox.base import ExecResult

    evaluated = EvalResult(job_id="j", task_id="example/relu_add", language="triton", device="cpu", device_name="cpu",
                           mode=Mode.FINAL, correct=False, reward=-1, fault="candidate", violations=violations,
                           trials=[TrialReport(trial=i, correct=ok, message=message)
                                   for i, (ok, message) in enumerate(trials)])
    assert evaluated.summary()["error"] is None  # what the harness records: the reason is elsewhere
    monkeypatch.setattr(Episode, "build_and_evaluate",
                        lambda self, mode: (ExecResult(output="CHECK OK", exit_code=0, duration_s=0.1), evaluated))
    result = runner.invoke(app, ["run-task", "example/relu_add", "--solution", str(example_dir("relu_add") / "solutions" /
                                 "triton"), "--language", "triton", "--device", "cpu", "--json"])
    assert result.exit_code == 1, result.output
    record = json.loads(result.stdout.splitlines()[-1])
    assert (record["verdict"], record["error"]) == (verdict, error)
    assert record["build_ok"] is True and record["violations"] == violations
    assert re.search(rf"done in [\d.]+ s: {verdict}, reward -1 \(", result.stderr), result.stderr


@pytest.mark.slow  # 20-40 s: the trusted evaluation of a wrong answer, its baselines measured
def test_run_task_json_of_a_real_wrong_answer(tmp_path):
    task = tmp_path / "relu_add_4k.py"
    task.write_text((example_dir("relu_add") / "task.py").read_text().replace("1 << 24", "1 << 12"))
    solution = tmp_path / "wrong"
    solution.mkdir()
    triton = (example_dir("relu_add") / "solutions" / "triton" / "model_new.py").read_text()
    (solution / "model_new.py").write_text(triton.replace("v = x + y", "v = x - y"))  # relu(x - y): wrong
    result = _cli("run-task", str(task), "--solution", str(solution), "--language", "triton", "--device", "cpu",
                  "--json", home=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["verdict"] == "wrong answer" and record["violations"] == [], record
    assert record["error"] == f"wrong answer in trial 1: {record['mismatch']}", record
    assert "elements outside atol=0.01, rtol=0.01" in record["error"]


@pytest.mark.slow  # 19 s: a whole run-task --solution
def test_run_task_solution_piped_prints_its_phases_and_lines_whole_at_80_columns(tmp_path):
    """A log of `run-task --solution` shows each phase as it starts, stamped with the seconds since
    the start, and within the trusted evaluation each of its steps as it begins (indented), then the
    result: no line broken at 80 columns, the table within them, its numbers whole."""
    task = tmp_path / "relu_add_4k.py"
    task.write_text((example_dir("relu_add") / "task.py").read_text().replace("1 << 24", "1 << 12"))
    result = _cli("run-task", str(task), "--solution", str(example_dir("relu_add") / "solutions" / "triton"),
                  "--language", "triton", "--device", "cpu", home=tmp_path, columns=80)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    still = [line for line in lines if re.match(r"^\[ *\d+\.\d s\]   still ", line)]  # QUIET_S without a line
    assert all(re.search(r" \(\d+ s( into verifying and timing)?\)$", line) for line in still), still
    lines = [line for line in lines if line not in still]
    phases = [line for line in lines if not re.match(r"^\[ *\d+\.\d s\]   ", line)]
    assert [re.sub(r"^\[ *\d+\.\d s\] ([a-z ]+?)(:| in).*", r"\1", line) for line in phases] == \
        ["setting up", "building", "verifying and timing", "done"], result.stderr
    evaluating = lines[lines.index(phases[2]) + 1:lines.index(phases[3])]  # the evaluation's steps, and nothing else
    assert evaluating == [line for line in lines if line not in phases], result.stderr
    steps = {re.sub(r"^\[ *\d+\.\d s\]   ", "", line) for line in evaluating}
    assert {"judge: RefTrials", "candidate: trials", "candidate: timing"} <= steps, steps
    assert "on the CPU" in phases[2] and "GPU" not in result.stderr
    assert re.search(r"done in [\d.]+ s: correct, reward 1 \(setting up [\d.]+ s, building [\d.]+ s, "
                     r"verifying and timing [\d.]+ s\)$", phases[3]), phases[3]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("build: CHECK OK: model_new.py")
    [timing] = [line for line in lines if line.startswith("time: ModelNew")]
    assert timing.endswith("(median per call)") and len(timing) > 80  # one line, however long
    [milestone] = [line for line in lines if line.startswith("milestone:")]
    assert milestone.endswith("(reward 1)")
    table = lines[lines.index(next(line for line in lines if line.startswith("file/relu_add_4k"))):]
    assert max(map(len, table)) <= 80, "\n".join(table)
    assert re.fullmatch(r"yes +1 +\d+\.\d{4} +\d+\.\d{4} +\d+\.\d{4} +[\d.e-]+x +[\d.e-]+x", table[-1].strip()), table


def test_a_phase_in_a_log_is_never_silent_for_longer_than_its_quiet_time(capsys, monkeypatch):
    """In a log (no terminal), a phase that says nothing for ``Phases.QUIET_S`` gets a ``still ...`` line
    naming what it was last said to be doing, and one more each ``QUIET_S`` after; a line of its own
    resets the count."""
    from kernel_env.cli.common import Phases

    monkeypatch.setattr(Phases, "QUIET_S", 0.6)
    with Phases() as phases:
        phases.start("building", "the cpp solution")
        time.sleep(1.5)
        phases.step("judge: RefTrials")
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    said = [re.sub(r"^\[ *\d+\.\d s\] ", "", line) for line in lines]
    assert said[0] == "building: the cpp solution" and said[-1] == "  judge: RefTrials", said
    still = said[1:-1]  # about two (at 0.6 s and 1.2 s), however late a loaded machine runs the ticker
    assert 1 <= len(still) <= 3 and all(re.fullmatch(r"  still building \(\d s\)", line) for line in still), said


@pytest.mark.parametrize("terminal", [True, False])
def test_the_metrics_table_fits_80_columns_with_every_number_whole(tmp_path, terminal):
    from kernel_env.workloads.analysis.metrics import EpisodeRecord

    def record(task: str, level: int | None, correct: bool, eager: float, compile: float, reward: float | None,
               stop: str = "finished") -> str:
        final = None if stop == "error" else {"correct": correct, "speedup_vs_eager": eager, "speedup_vs_compile": compile}
        return EpisodeRecord(task_id=task, level=level, stop=stop, final=final, reward=reward, tool_calls=7,
                             invalid_calls=1, model="Qwen/Qwen3-Coder-480B-A35B-Instruct", language="cuda",
                             device="cuda").model_dump_json() + "\n"

    run = tmp_path / "run.jsonl"
    run.write_text(record("a", 1, True, 123.456, 100.0, 3.0) + record("b", 2, False, 1.0, 1.0, -1.0)
                   + record("c", 3, True, 1.2, 0.9, 2.0) + record("d", 4, True, 0.0123, 0.01, 1.0)
                   + record("e", None, False, 1.0, 1.0, None, stop="error"))
    result = runner.invoke(app, ["report", str(run)], env={"COLUMNS": "80", "TTY_COMPATIBLE": "1" if terminal else "0"})
    assert result.exit_code == 0, result.output
    lines = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout).splitlines()  # a terminal's styles
    table = lines[1:lines.index("fast_p: correct with speed-up > p")]
    assert max(map(len, table)) <= 80, result.stdout
    assert table[0].split() == ["L1", "L2", "L3", "L4", "no", "level", "all"]
    cells = {label: rest for label, *rest in (re.split(r" {2,}", line.strip()) for line in table[2:] if line.strip())}
    assert cells["pass"] == ["100.0 %", "0.0 %", "100.0 %", "100.0 %", "0.0 %", "60.0 %"]
    assert cells["faster than eager (>1x)"] == ["100.0 %", "0.0 %", "100.0 %", "0.0 %", "0.0 %", "40.0 %"]
    assert cells["faster than compile (>1x)"] == ["100.0 %", "0.0 %", "0.0 %", "0.0 %", "0.0 %", "20.0 %"]
    assert cells["geomean vs eager"][:4] == ["123.46x", "—", "1.20x", "0.012x"]
    assert cells["mean reward"] == ["3.00", "-1.00", "2.00", "1.00", "—", "1.25"]
    [note] = [i for i, line in enumerate(lines) if line.startswith("Per task the best episode counts")]
    if terminal:  # a terminal wraps the note at its width...
        assert all(len(line) <= 80 for line in lines[note:]) and len(lines) > note + 1
    else:  # ...a log keeps it one line, whatever COLUMNS says
        assert lines[note].endswith("(no reward).") and "1.05x by default" in lines[note]


@pytest.mark.parametrize("terminal", [True, False])
def test_on_off_flags_have_no_value_placeholder_in_help(terminal):
    for command, flag in ((["doctor"], "--grade"), (["doctor"], "--no-grade"), (["run-task"], "--no-keep"), (["eval"], "--json"),
                          (["synth", "stats"], "--json"), ([], "--version")):
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "120", "TTY_COMPATIBLE": str(int(terminal))})
        assert result.exit_code == 0, result.output
        text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # a terminal's styles
        assert flag in text and "<bool>" not in text, text


def test_help_in_a_pipe_keeps_each_option_on_its_line_and_panels_on_a_terminal():
    piped = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "80", "TTY_COMPATIBLE": "0"}).stdout
    device = next(line for line in piped.splitlines() if line.lstrip().startswith("--device"))
    assert device.endswith("Where code is run and timed (default: cuda if there is a GPU, else cpu)."), piped
    assert "╭" not in piped and "\\[" not in piped
    terminal = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "80", "TTY_COMPATIBLE": "1"}).stdout
    terminal = re.sub(r"\x1b\[[0-9;]*m", "", terminal)
    assert "─ Options ─" in terminal and max(map(len, terminal.splitlines())) <= 80, terminal


def test_a_usage_error_in_a_pipe_is_plain_lines():
    result = runner.invoke(app, ["eval", "examples", "extra"], env={"TTY_COMPATIBLE": "0"})
    assert result.exit_code == 2
    assert "Error: Got unexpected extra argument(s) (extra)" in result.output and "╭" not in result.output, result.output


@pytest.mark.parametrize("command", [["eval", "examples"], ["generate", "--tasks", "examples"]])
def test_a_missing_model_server_is_reported_before_torch_is_imported(command, tmp_path):
    """The server check is the first thing a long run does that could fail on a fresh machine: it
    comes before the seconds torch takes to import (a refused connection in well under a second)."""
    code = ("import sys\nfrom kernel_env.cli import app\n"
            f"try:\n    app({[*command, '--base-url', 'http://127.0.0.1:9/v1']!r})\n"
            "except SystemExit as exc:\n    print('exit', exc.code, 'torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={**os.environ, "KERNEL_ENV_HOME": str(tmp_path)})
    assert run.stdout.strip() == "exit 2 False", run.stdout + run.stderr
    assert "cannot reach the model server at http://127.0.0.1:9/v1 (ConnectError" in run.stderr
    assert list(tmp_path.iterdir()) == [], "nothing is written when a run fails before it starts"


def _drive_in_a_terminal(argv: list[str], env: dict, dialogue: list[tuple[str, bytes]], timeout: float = 30) -> tuple[str, int]:
    """Run argv on a real pseudo-terminal; for each (expected, keys), wait until the terminal shows
    ``expected`` (after what was matched before), then type ``keys``. Returns (screen, exit code)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes the CLI on the terminal
        os.execve(argv[0], argv, env)
    screen, seen, reaped = b"", 0, False

    def read(seconds: float) -> None:
        nonlocal screen
        if select.select([fd], [], [], seconds)[0]:
            try:
                screen += os.read(fd, 65536)
            except OSError:  # the terminal closed: the CLI ended
                time.sleep(seconds)

    try:
        for expected, keys in dialogue:
            deadline = time.monotonic() + timeout
            while screen.find(expected.encode(), seen) < 0:
                assert time.monotonic() < deadline, f"waited for {expected!r}; the terminal showed:\n{screen.decode(errors='replace')}"
                read(0.05)
            seen = screen.find(expected.encode(), seen) + len(expected)
            os.write(fd, keys)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            read(0.05)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                read(0.05)
                return screen.decode(errors="replace"), os.waitstatus_to_exitcode(status)
        raise AssertionError(f"run-task did not end; the terminal showed:\n{screen.decode(errors='replace')}")
    finally:
        os.close(fd)
        if not reaped:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


@pytest.mark.parametrize("keep", [True, False])
def test_run_task_in_a_terminal_opens_a_shell_in_the_sandbox(tmp_path, keep):
    reason = bubblewrap_skip_reason()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "KERNEL_ENV_HOME": str(tmp_path), "TERM": "xterm", "COLUMNS": "80"}
    argv = [sys.executable, "-m", "kernel_env.cli", "run-task", "example/relu_add", "--language", "cpp"]
    if not keep:
        argv.append("--no-keep")
    prompt = "[kernel-env workspace]$ "
    screen, code = _drive_in_a_terminal(argv, env, [
        # "sleeping" comes from the foreground job itself, so Ctrl-C cannot race its start.
        (prompt, b"echo uid=$(id -u) cwd=$(pwd); echo x >> model.py\n"),
        # Typing into the shared terminal (TIOCSTI) would run commands in the host shell later.
        (prompt, b"python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"#\")' 2>&1 | tail -1\n"),
        (prompt, b"sh -c 'echo sleep''ing; exec sleep 30'\n"),
        ("sleeping\r\n", b"\x03"),  # Ctrl-C stops the shell's command, not kernel-env
        (prompt, b"echo still-$((1 + 1))\n"),
        ("still-2", b"exit\n"),
    ])
    assert code == 0, screen
    assert "uid=1000 cwd=/workspace" in screen
    assert "model.py: Permission denied" in screen or "model.py: Read-only file system" in screen
    assert "still-2" in screen
    assert "PermissionError: [Errno 1] Operation not permitted" in screen
    assert "compile" in screen and "python3 -m utils.verification" in screen
    workspaces = list((tmp_path / "workspaces").iterdir())
    if keep:
        assert len(workspaces) == 1 and "workspace kept:" in screen
        assert str(workspaces[0] / "workspace") in screen.replace("\r\n", "")
        # The command to delete it is one line to copy, even in 80 columns (the terminal wraps it, not rich).
        assert f"remove it with: chmod -R u+w {workspaces[0]} && rm -rf {workspaces[0]}\r\n" in screen, screen
    else:
        assert workspaces == []


def test_ctrl_c_reaches_a_waiting_event_loop_whichever_thread_takes_the_signal():
    """A SIGINT sent to the process may land on any of its threads; asyncio.run's own handler then
    waits for the loop to wake (a generate run waiting on a model's answer sat it out: 60 s in CI).
    The CLI's runner wakes the loop, cancels the run and raises KeyboardInterrupt at once."""
    import asyncio
    import signal
    import threading
    import time

    from kernel_env.cli.common import run_interruptibly

    cleaned = []

    async def waiting_for_an_answer():
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)  # the run's own clean-up still runs

    def interrupt_from_another_thread():
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Thread(target=interrupt_from_another_thread, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_interruptibly(waiting_for_an_answer())
    assert time.monotonic() - started < 5 and cleaned == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_with_an_evaluators_fault_ends_with_exit_2_and_names_every_item_left():
    from io import StringIO

    from rich.console import Console

    from kernel_env.cli.common import end_of_run

    text = StringIO()
    console = Console(file=text, width=200)
    code = end_of_run(console, failed={"a": "the model call failed"}, evaluator_faults={"b": "the Ray worker died twice"},
                      quiet=False, fault_note="the evaluator's fault")
    assert code == 2
    assert "a: the model call failed (a rerun tries it again)" in text.getvalue()
    assert "b: the Ray worker died twice (the evaluator's fault; a rerun tries it again)" in text.getvalue()
    assert end_of_run(console, failed={"a": "x"}, evaluator_faults={}, quiet=True, fault_note="") == 1
    assert end_of_run(console, failed={}, evaluator_faults={}, quiet=True, fault_note="") == 0
