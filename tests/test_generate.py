"""`kernel-env generate`: the seed orchestrator against a real OpenAI-compatible server on loopback.

The server (tests/scripted_llm.py) replays scripted completions; the client is the real
``openai`` package; answers are evaluated by real KernelRefine-v0 episodes on the CPU. Most
scripted answers hold no usable code or do not build, so they are answered without a trusted
evaluation; one test evaluates a real Triton kernel.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from scripted_llm import Reply, ScriptedLLM
from support import TINY_TASK
from typer.testing import CliRunner

from kernel_env.cli import app
from kernel_env.evaluators.records import EvalSettings
from kernel_env.tasks import Task
from kernel_env.workloads.runs.generate import (
    GenerateConfig,
    QueueItem,
    RefineQueue,
    ServerUnreachable,
    TraceStore,
    generate,
    select_tasks,
)

runner = CliRunner()
SETTINGS = EvalSettings(timed_calls=10, warmup_calls=3, job_timeout_s=120, compile_baseline=False)
RELU_ADD = TINY_TASK.replace("return torch.relu(x) * self.scale", "return torch.relu(x + y)") \
    .replace("def forward(self, x: torch.Tensor)", "def forward(self, x: torch.Tensor, y: torch.Tensor)") \
    .replace("return [torch.randn(8, 16)]", "return [torch.randn(8, 16), torch.randn(8, 16)]")
FUSED = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        v = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v), mask=mask)


    class ModelNew(nn.Module):
        def __init__(self, scale: float = 2.0):
            super().__init__()

        def forward(self, x, y):
            out = torch.empty_like(x)
            relu_add_kernel[(1,)](x.contiguous(), y.contiguous(), out, x.numel(), BLOCK=128)
            return out
    """
)


def task(name: str, code: str = TINY_TASK) -> Task:
    return Task(id=f"test/{name}", code=code, source="kernelbook", name=name)


def asked(request: dict) -> tuple[str, int]:
    """(task id, turn) of a chat request: the task named in the first user message, 1 + earlier answers."""
    task_id = re.search(r"model\.py of task (\S+)\)", request["messages"][1]["content"]).group(1)
    return task_id, 1 + sum(m["role"] == "assistant" for m in request["messages"])


def order(llm: ScriptedLLM) -> list[str]:
    return [f"{name.removeprefix('test/')}{turn}" for name, turn in map(asked, llm.requests)]


def run(tasks: list[Task], llm: ScriptedLLM, output: Path, **options) -> tuple:
    """A generate run of Triton answers on the CPU (the seed's traces are Triton's)."""
    config = GenerateConfig(base_url=llm.base_url, language="triton", device="cpu", settings=SETTINGS, **options)
    with TraceStore(output) as store:
        summary = asyncio.run(generate(tasks, config, store))
    return summary, {t["sample_key"]: t for t in json.loads(output.read_text())}


def tasks_file(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"test/{n}", "name": n, "code": TINY_TASK}) + "\n" for n in names))
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ============================================================================ the passive queue


def test_queue_is_fifo_and_retries_go_to_the_back():
    queue = RefineQueue(max_turns=3, language="triton")
    a, b = QueueItem.for_task(task("a"), "triton"), QueueItem.for_task(task("b"), "triton")
    queue.add(a)
    queue.add(b)
    first = queue.pop()
    queue.requeue_with_feedback(first, "Correct but slow (0.50x PyTorch).", "<triton>v1</triton>")
    assert [queue.pop().sample_key, queue.pop().sample_key, queue.pop()] == ["test/b", "test/a", None]
    assert first.turn_num == 2 and [m["role"] for m in first.messages[-2:]] == ["assistant", "user"]
    assert first.messages[-1]["content"] == "Correct but slow (0.50x PyTorch)."


def test_queue_stops_feeds_back_and_finalizes_like_the_environment():
    queue = RefineQueue(max_turns=2, language="triton")
    item = QueueItem.for_task(task("a"), "triton")
    incorrect = {"correctness": False, "status": "incorrect", "mismatch": "trial 1: off by one"}
    assert queue.should_stop(1, incorrect) == (False, "continue")
    assert queue.build_feedback(incorrect).startswith("Incorrect output: mismatch with the PyTorch reference")
    item.turns_history.append({"turn": 1, "full_completion": "<triton>x</triton>", "triton_code": "x",
                               "result": incorrect, "feedback_given": None})
    assert queue.should_stop(2, incorrect) == (True, "max_turns_reached")
    trace = queue.finalize(item, "max_turns_reached")
    assert trace["num_turns"] == 1 and trace["final_triton_code"] == "x" and trace["source"] == "kernelbook"
    assert trace["full_messages"][-1] == {"role": "assistant", "content": "<triton>x</triton>"}
    assert queue.completed == [trace]


# ============================================================================ the output


def test_a_finished_trace_is_on_disk_before_add_returns_and_a_crash_journal_is_folded(tmp_path):
    output = tmp_path / "traces.json"
    store = TraceStore(output, fold_every=100).open()
    store.add({"sample_key": "a", "turns": []})
    journal = output.with_name("traces.json.journal.jsonl")
    assert json.loads(journal.read_text().splitlines()[0])["sample_key"] == "a"
    with journal.open("a") as handle:
        handle.write('{"sample_key": "b", "tur')  # the torn line of a crash mid-write
    reopened = TraceStore(output).open()
    assert reopened.finished == {"a"} and not journal.exists()
    assert [t["sample_key"] for t in json.loads(output.read_text())] == ["a"]


def test_an_output_that_is_not_a_trace_list_is_refused(tmp_path):
    output = tmp_path / "traces.json"
    output.write_text('{"not": "a list"}')
    with ScriptedLLM(lambda request: Reply(content="unused")) as llm:
        result = runner.invoke(app, ["generate", "--tasks", str(tasks_file(tmp_path, "a")), "-o", str(output),
                                     "--base-url", llm.base_url])
        assert llm.requests == []
    assert result.exit_code == 2 and "not a list of traces" in result.output, result.output
    assert output.read_text() == '{"not": "a list"}'


# ============================================================================ the loop


def test_multi_turn_generation_evaluates_feeds_back_and_keeps_reasoning(tmp_path):
    a, b = task("a", RELU_ADD), task("b", RELU_ADD)
    script = {("test/a", 1): Reply(content="Let me think about it first.", reasoning_content="plan for a"),
              ("test/b", 1): Reply(content="<triton>\ndef broken(:\n</triton>", reasoning_content="plan for b"),
              ("test/a", 2): Reply(content=f"<think>Fuse it.</think>\n<triton>\n{FUSED}</triton>", reasoning_content="fuse"),
              ("test/b", 2): Reply(content="Still thinking.")}
    with ScriptedLLM(lambda request: script[asked(request)]) as llm:
        summary, traces = run([a, b], llm, tmp_path / "out.json", multi_turn=True, max_turns=2, batch_size=1)
        assert order(llm) == ["a1", "b1", "a2", "b2"], "FIFO: a retry waits behind every sample already in line"
        b_retry = llm.requests[3]["messages"]
    assert summary.written == 2 and summary.max_turns_reached == 2 and not summary.failed
    assert b_retry[-1]["role"] == "user" and b_retry[-1]["content"].startswith("Compilation/runtime error:")
    assert "model_new.py:1" in b_retry[-1]["content"], b_retry[-1]["content"]
    trace = traces["test/a"]
    assert trace["num_turns"] == 2 and [t["model_reasoning"] for t in trace["turns"]] == ["plan for a", "fuse"]
    assert trace["turns"][1]["thinking"] == "Fuse it." and trace["final_triton_code"].strip() == FUSED.strip()
    assert trace["final_result"]["correctness"] is True, trace["final_result"]
    assert trace["turns"][0]["feedback_given"].startswith("Could not use your answer")
    assert trace["turns"][1]["feedback_given"] is None
    assert [m["role"] for m in trace["full_messages"]] == ["system", "user", "assistant", "user", "assistant"]


def test_new_samples_join_at_the_back_as_others_finish(tmp_path):
    tasks = [task("a"), task("b"), task("c")]
    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        summary, traces = run(tasks, llm, tmp_path / "out.json", multi_turn=True, max_turns=2, batch_size=1, max_active=2)
        assert order(llm) == ["a1", "b1", "a2", "b2", "c1", "c2"]
    assert summary.written == 3 and set(traces) == {"test/a", "test/b", "test/c"}


def test_batches_ask_for_several_samples_at_once(tmp_path):
    in_flight, peak, lock = [0], [0], threading.Lock()

    def slow(request: dict) -> Reply:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.3)
        with lock:
            in_flight[0] -= 1
        return Reply(content="no code")

    with ScriptedLLM(slow) as llm:
        summary, _ = run([task(n) for n in "abcd"], llm, tmp_path / "out.json", batch_size=3)
    assert peak[0] == 3 and summary.written == 4


def test_rerunning_skips_finished_samples_and_does_the_rest(tmp_path):
    output = tmp_path / "out.json"
    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        first = runner.invoke(app, ["generate", "--base-url", llm.base_url, "--tasks", str(tasks_file(tmp_path, "a", "b")),
                                    "-o", str(output), "--device", "cpu", "--language", "triton", "--json"])
        assert first.exit_code == 0, first.output
        assert sorted(order(llm)) == ["a1", "b1"], "without --multi-turn, one generation per sample (a batch: in any order)"
    before = {t["sample_key"]: t for t in json.loads(output.read_text())}
    assert all(t["num_turns"] == 1 and t["stop_reason"] == "max_turns_reached" for t in before.values())

    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        second = runner.invoke(app, ["generate", "--base-url", llm.base_url, "--tasks",
                                     str(tasks_file(tmp_path, "a", "b", "c")), "-o", str(output), "--device", "cpu", "--language", "triton", "--json"])
        assert second.exit_code == 0, second.output
        assert order(llm) == ["c1"]
    summary = json.loads(second.stdout)
    assert (summary["skipped"], summary["written"]) == (2, 1)
    after = {t["sample_key"]: t for t in json.loads(output.read_text())}
    assert set(after) == {"test/a", "test/b", "test/c"} and all(after[k] == before[k] for k in before)


def test_a_failed_model_call_leaves_its_sample_for_a_rerun_and_exits_1(tmp_path):
    def flaky(request: dict) -> Reply:
        if asked(request)[0] == "test/b":
            raise RuntimeError("the GPU of the model server fell over")
        return Reply(content="no code")

    output = tmp_path / "out.json"
    with ScriptedLLM(flaky) as llm:
        result = runner.invoke(app, ["generate", "--base-url", llm.base_url, "--tasks", str(tasks_file(tmp_path, "a", "b")),
                                     "-o", str(output), "--device", "cpu", "--language", "triton"])
    assert result.exit_code == 1, result.output
    assert "test/b" in result.output and "fell over" in result.output and "rerun" in result.output
    assert [t["sample_key"] for t in json.loads(output.read_text())] == ["test/a"]


def test_an_unreachable_server_is_a_clear_error_with_exit_2_at_once_and_writes_nothing(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = runner.invoke(app, ["generate", "--base-url", url, "--tasks", str(tasks_file(tmp_path, "a")),
                                 "-o", str(tmp_path / "out.json"), "--device", "cpu"])
    assert result.exit_code == 2 and f"cannot reach the model server at {url}" in result.output, result.output
    started = time.monotonic()
    with TraceStore(tmp_path / "again.json") as store, pytest.raises(ServerUnreachable, match="start it"):
        asyncio.run(generate([task("a")], GenerateConfig(base_url=url, device="cpu"), store))
    assert time.monotonic() - started < 1.0, "a refused connection is reported without retries"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"], "a run that never started wrote a file"


def test_a_model_the_server_does_not_serve_fails_before_any_sample(tmp_path):
    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        result = runner.invoke(app, ["generate", "--base-url", llm.base_url, "--model", "no-such-model", "--tasks",
                                     str(tasks_file(tmp_path, "a")), "-o", str(tmp_path / "out.json"), "--device", "cpu"])
        assert llm.requests == []
    assert result.exit_code == 2, result.output
    assert "does not serve 'no-such-model'; it serves scripted-model" in result.output, result.output
    assert not (tmp_path / "out.json").exists()


def test_the_language_follows_the_machine_unless_named(tmp_path, monkeypatch):
    from kernel_env.runtime import episode

    monkeypatch.setattr(episode, "visible_gpus", lambda: [])  # a CPU machine: cpp, as every entry point
    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        config = GenerateConfig(base_url=llm.base_url.removesuffix("/v1"), settings=SETTINGS)  # /v1 is added
        with TraceStore(tmp_path / "out.json") as store:
            summary = asyncio.run(generate([task("a")], config, store))
        assert "<cpp>" in llm.requests[0]["messages"][0]["content"]
    assert summary.base_url == llm.base_url and summary.written == 1
    [trace] = json.loads((tmp_path / "out.json").read_text())
    assert trace["language"] == "cpp"
    assert RefineQueue(language=None).language.name == "cpp"


def test_outputs_get_the_umasks_mode_or_keep_the_one_they_replace(tmp_path):
    from kernel_env.workloads.runs.agent_eval import RunFile
    from kernel_env.workloads.analysis.metrics import EpisodeRecord

    umask = os.umask(0o022)
    try:
        store = TraceStore(tmp_path / "traces.json", fold_every=1).open()
        store.create()
        store.add({"sample_key": "a", "turns": []})
        run_file = RunFile(tmp_path / "run.jsonl").create()
        run_file.append(EpisodeRecord(task_id="a", stop="finished"))
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
        assert modes == {"traces.json": 0o644, "run.jsonl": 0o644}, {k: oct(v) for k, v in modes.items()}
        (tmp_path / "traces.json").chmod(0o640)
        store.add({"sample_key": "b", "turns": []})
        assert (tmp_path / "traces.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_without_samples_generate_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["generate", "-o", str(tmp_path / "out.json")])
    assert result.exit_code == 2 and "--kernelbench" in result.output


def test_capped_sources_give_a_reproducible_sample_in_source_order(tmp_path):
    root = tmp_path / "KernelBench"
    (root / "level1").mkdir(parents=True)
    for number in range(1, 7):
        (root / "level1" / f"{number}_Op{number}.py").write_text(TINY_TASK)
    book = tmp_path / "book.jsonl"
    book.write_text("".join(json.dumps({"id": f"kb{i}", "code": TINY_TASK}) + "\n" for i in range(5)))
    picked = select_tasks(kernelbench=root, kernelbook=book, kernelbench_samples=3, kernelbook_samples=2, seed=7)
    assert picked == select_tasks(kernelbench=root, kernelbook=book, kernelbench_samples=3, kernelbook_samples=2, seed=7)
    assert [t.source for t in picked] == ["kernelbook"] * 2 + ["kernelbench"] * 3
    bench = [t.problem_id for t in picked if t.source == "kernelbench"]
    assert bench == sorted(bench) and len(set(bench)) == 3


def test_ctrl_c_keeps_every_finished_trace_and_a_rerun_resumes(tmp_path):
    release = threading.Event()

    def answer(request: dict) -> Reply:
        if asked(request)[0] == "test/b":
            release.wait(60)  # b's generation is in flight when Ctrl-C arrives
        return Reply(content="no code")

    output = tmp_path / "out.json"
    journal = output.with_name("out.json.journal.jsonl")
    with ScriptedLLM(answer) as llm:
        process = subprocess.Popen(
            [sys.executable, "-m", "kernel_env.cli", "generate", "--base-url", llm.base_url, "--tasks",
             str(tasks_file(tmp_path, "a", "b")), "-o", str(output), "--device", "cpu", "--language", "triton", "--batch-size", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
        try:
            deadline = time.monotonic() + 120
            while not (len(llm.requests) == 2 and (journal.exists() or "test/a" in _keys(output))):
                assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
                time.sleep(0.1)
            process.send_signal(signal.SIGINT)
            printed, _ = process.communicate(timeout=60)
        finally:
            release.set()
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, printed
    assert "interrupted" in printed and _keys(output) == ["test/a"] and not journal.exists(), printed

    with ScriptedLLM(lambda request: Reply(content="no code")) as llm:
        summary, traces = run(select_tasks(tasks=tasks_file(tmp_path, "a", "b")), llm, output)
        assert order(llm) == ["b1"]
    assert summary.skipped == 1 and set(traces) == {"test/a", "test/b"}


def _keys(output: Path) -> list[str]:
    try:
        return [t["sample_key"] for t in json.loads(output.read_text())]
    except (OSError, ValueError):
        return []
