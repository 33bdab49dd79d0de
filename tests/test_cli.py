"""The kernel-env command line: tasks, doctor, run-task; exit codes 0 ok, 1 task failed, 2 usage/environment."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support import TINY_TASK, bubblewrap_skip_reason
from kernel_env.cli import app
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


def test_doctor_json_reports_the_machine_and_what_it_means():
    result = runner.invoke(app, ["doctor", "--json"])
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


def test_doctor_prints_a_table_and_its_meaning():
    result = runner.invoke(app, ["doctor", "--no-grade"])
    assert result.exit_code == 0, result.output
    assert "grading" not in result.stdout
    for word in ("python", "torch", "nvcc", "bubblewrap", "evaluation", "ripgrep", "What this means"):
        assert word in result.stdout


# ----------------------------------------------------------------------------- run-task


def _cli(*args: str, home: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERNEL_ENV_HOME": str(home), "COLUMNS": "200"}
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


def test_run_task_json_needs_solution_mode():
    result = runner.invoke(app, ["run-task", "example/relu_add", "--json"])
    assert result.exit_code == 2 and "--json belongs to solution mode" in result.stderr


def test_run_task_rejects_an_unknown_language():
    result = runner.invoke(app, ["run-task", "example/relu_add", "--language", "fortran"])
    assert result.exit_code == 2


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
    env = {**os.environ, "KERNEL_ENV_HOME": str(tmp_path), "TERM": "xterm", "COLUMNS": "300"}
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
