"""`kernel-env eval` and `kernel-env report`: KernelAgent-v0 episodes driven by a real `openai`
client against a real OpenAI-compatible server on loopback (tests/scripted_llm.py) that replays
scripted tool calls; real sandboxes, the real pool and trusted harness on the CPU.

The main test solves the bundled relu_add example in C++ the way an agent would (write the
kernels, build, verify, Finish) with the example's own solution files, and checks the record, the
reward against ``run_solution``, the metrics and that `report` rebuilds the same tables. To keep
it to a couple of minutes on a small shared box, the example runs on 64K elements instead of 16M
(each trusted evaluation of the full size costs 40-60 s of CPU here, the builds as much again),
the protocol is shortened (few timed calls, no torch.compile baseline) and the speed-up margin set
out of reach, so the milestone of a correct solution is exactly 1 whatever the timings do. The
other tests use a tiny Triton task (Triton's interpreter: no build) or no environment at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import threading
import time
from pathlib import Path

import pytest
from scripted_llm import Refused, Reply, ScriptedLLM
from typer.testing import CliRunner

from kernel_env.cli import app
from kernel_env.evaluators.records import EvalSettings
from kernel_env.evaluators.reward import milestone_reward
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import run_solution
from kernel_env.tasks import Task, load_task_file
from kernel_env.workloads.runs.agent_eval import (
    AgentRunConfig,
    RunFile,
    ServerUnreachable,
    assistant_message,
    request_message,
    run_agent_eval,
    tool_messages,
)
from kernel_env.workloads.runs.llm import RunError, Server, connect
from kernel_env.workloads.analysis.metrics import EpisodeRecord, compute_metrics, read_records

pytestmark = pytest.mark.slow  # end to end: scripted-model episodes, each built and evaluated

runner = CliRunner()
SETTINGS = EvalSettings.short(speedup_margin=1000.0)
SETTINGS_JSON = SETTINGS.model_dump_json()
CPP = example_dir("relu_add") / "solutions" / "cpp"
TRITON_SOLUTION = (example_dir("relu_add") / "solutions" / "triton" / "model_new.py").read_text()
EXAMPLE_CODE = (example_dir("relu_add") / "task.py").read_text()
TINY_CODE = EXAMPLE_CODE.replace("1 << 24", "1 << 12")
assert TINY_CODE != EXAMPLE_CODE


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def asked(request: dict) -> tuple[str, int]:
    """(task id, turn) of a chat request: the task its prompt names, and the answers given so far."""
    task_id = re.search(r"^# Task (\S+)", request["messages"][1]["content"], re.M).group(1)
    return task_id, sum(message["role"] == "assistant" for message in request["messages"])


def scripted(scripts: dict[str, list[Reply]]):
    """A handler answering each task's requests from its own script, by turn."""
    return lambda request: scripts[asked(request)[0]][asked(request)[1]]


def tiny_tasks(tmp_path: Path, *names: str) -> Path:
    """A JSONL source of tiny relu(x + y) tasks (4096 elements), ids tiny/<name>."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"tiny/{n}", "name": n, "code": TINY_CODE, "source": "file"}) + "\n"
                            for n in names))
    return path


# ============================================================================ the C++ example, end to end


CPP_SCRIPT = [
    Reply(content="Let me see the starter.", tool_calls=[call("Read", file_path="model_new.py")]),
    Reply(content="One fused pass.", tool_calls=[
        call("Write", file_path="model_new.py", content=(CPP / "model_new.py").read_text()),
        call("Write", file_path="kernels/relu_add.cpp", content=(CPP / "kernels" / "relu_add.cpp").read_text()),
        call("Write", file_path="kernels/relu_add_binding.cpp",
             content=(CPP / "kernels" / "relu_add_binding.cpp").read_text())]),
    Reply(tool_calls=[call("Bash", command="bash utils/compile.sh", timeout=600_000)]),
    Reply(tool_calls=[call("Bash", command="python3 -m utils.verification", timeout=600_000)]),
    Reply(content="Done.", tool_calls=[call("Finish", summary="fused relu(x + y)")]),
]


def test_eval_solves_the_cpp_example_and_report_rebuilds_its_tables(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kernel_env.runtime.episode")  # run_solution's phases
    source = tmp_path / "relu_add.py"
    source.write_text(EXAMPLE_CODE.replace("1 << 24", "1 << 16"))
    task = load_task_file(source)
    # The reference: the same solution through run_solution, in a thread while the episode runs.
    reference: dict = {}
    thread = threading.Thread(target=lambda: reference.update(result=run_solution(
        task, CPP, language="cpp", device="cpu", settings=SETTINGS)))
    thread.start()
    output, plot, table = tmp_path / "run.jsonl", tmp_path / "speedups.png", tmp_path / "run.md"
    with ScriptedLLM(scripted({task.id: CPP_SCRIPT})) as llm:
        result = runner.invoke(app, ["eval", str(source), "--language", "cpp", "--device", "cpu",
                                     "--base-url", llm.base_url, "--settings", SETTINGS_JSON, "--output", str(output),
                                     "--plot", str(plot), "--markdown", str(table)])
    thread.join()
    assert result.exit_code == 0, result.output
    phases = [r.getMessage() for r in caplog.records
              if r.name == "kernel_env.runtime.episode" and r.getMessage().startswith(task.id)]
    assert phases[:2] == [f"{task.id}: setting up its workspace and sandbox (local)",
                          f"{task.id}: building the cpp solution, then its trusted evaluation (final) on the cpu"], phases
    assert re.fullmatch(rf"{task.id}: done in \d+\.\d s: correct, reward [123](\.0)?", phases[2]), phases

    # The progress, as a log shows it: each turn, each evaluation the episode asked for, then its end, stamped.
    progress = [re.sub(r"^\[ *\d+\.\d s\] ", "", line) for line in result.stderr.splitlines() if line.startswith("[")]
    turns = [line for line in progress if " turn " in line]
    assert turns == [f"{task.id}: turn {n} of 200" for n in range(1, 6)], result.stderr
    progress = [line for line in progress if line not in turns]
    assert progress[:2] == [f"{task.id}: verification (evaluation 1 of the episode)",
                            f"{task.id}: final evaluation (evaluation 2 of the episode)"], result.stderr
    assert re.fullmatch(rf"{task.id}: finished after 5 turns \(\d+ s\), reward 1.0, correct True", progress[2]), progress

    # The conversation the server saw: tools offered, the history sent back every turn.
    assert len(llm.requests) == len(CPP_SCRIPT)
    first = llm.requests[0]
    assert first["model"] == "scripted-model" and first["messages"][0]["role"] == "system"
    assert {tool["function"]["name"] for tool in first["tools"]} >= {"Bash", "Read", "Write", "Finish"}
    assert [m["role"] for m in llm.requests[2]["messages"]] == ["system", "user", "assistant", "tool", "assistant",
                                                                "tool", "tool", "tool"]

    [record] = read_records(output)
    assert (record.task_id, record.name, record.language, record.device, record.model) == \
        (task.id, "relu_add", "cpp", "cpu", "scripted-model")
    assert (record.stop, record.error, record.turns, record.tool_calls, record.invalid_calls) == ("finished", None, 5, 7, 0)
    # Every assistant tool call is answered by one tool message with its id, in order.
    calls = [c["id"] for m in record.messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in record.messages if m["role"] == "tool"]
    assert calls == answers and len(calls) == 7
    outputs = [m["content"] for m in record.messages if m["role"] == "tool"]
    assert "BUILD OK" in outputs[4] and "correctness: PASS" in outputs[5]
    assert record.tools and record.settings["speedup_margin"] == 1000.0
    # What a trainer accounts: the server's tokens, the calls by tool, the time split.
    assert record.tokens["completion"] > 0 and record.tokens["prompt"] >= record.tokens["context"] > 0
    assert record.rollout["tool_calls"] == {"Read": 1, "Write": 3, "Bash": 2, "Finish": 1}
    assert (record.rollout["tool_errors"], record.rollout["repeated_calls"]) == (0, 0)
    assert all(record.rollout["time_s"][part] > 0 for part in ("model", "tools", "builds", "evaluations"))

    # The trusted evaluations: the agent's verification, then the final one; the reward is the final milestone.
    assert [e["mode"] for e in record.evaluations] == ["verify", "final"] and record.evaluations[0]["correct"]
    final = record.final
    assert final["correct"] and final["mode"] == "final" and final["runtime_ms"] > 0 and final["compile_ms"] is None
    assert record.reward == final["reward"] == 1.0
    assert record.reward == milestone_reward(True, final["runtime_ms"], final["eager_ms"], None, SETTINGS.speedup_margin)
    assert "FINAL EVALUATION" in record.final_report
    build, solution = reference["result"]
    assert build.ok, build.output
    assert solution.correct and solution.reward == record.reward, (solution.error, solution.violations, solution.log_tail)

    # The metrics of the run, and the same tables again from the file.
    overall = compute_metrics([record]).overall
    speedup = final["speedup_vs_eager"]
    assert (overall.tasks, overall.passed, overall.pass_rate, overall.errors) == (1, 1, 1.0, 0)
    assert overall.geomean["eager"] == pytest.approx(speedup) and overall.geomean["compile"] is None
    assert overall.faster == {"eager": 1.0 if speedup > 1.0 else 0.0, "compile": None}
    markdown = table.read_text()
    assert "| all | 1 | 100.0 % |" in markdown and "scripted-model · cpp on cpu · 1 task, 1 episode" in markdown
    assert plot.read_bytes()[:4] == b"\x89PNG"
    again = runner.invoke(app, ["report", str(output), "--markdown", "-"])
    assert again.exit_code == 0 and again.stdout == markdown
    as_json = runner.invoke(app, ["report", str(output), "--json"])
    assert json.loads(as_json.stdout)["metrics"] == compute_metrics([record]).to_dict()

    # Its trajectory for rejection fine-tuning: kept by the paper's filter, dropped by a stricter one.
    rft = tmp_path / "rft.jsonl"
    kept = runner.invoke(app, ["export", str(output), "-o", str(rft)])
    assert kept.exit_code == 0 and "1 of 1 trajectories written" in kept.stdout, kept.output
    [trajectory] = [json.loads(line) for line in rft.read_text().splitlines()]
    assert trajectory["messages"] == record.messages and trajectory["tools"] == record.tools
    assert trajectory["reward"] == 1.0 and trajectory["rollout"] == record.rollout
    strict = runner.invoke(app, ["export", str(output), "-o", str(rft), "--min-reward", "1", "--json"])
    assert json.loads(strict.stdout) == {"output": str(rft), "records": 1, "written": 0,
                                         "dropped": {"reward 1 is not above 1": 1}}
    assert rft.read_text() == ""


# ============================================================================ conversation rules, resume


def test_a_reply_without_a_tool_call_is_nudged_and_a_rerun_skips_finished_tasks(tmp_path):
    scripts = {
        "tiny/a": [Reply(content="I will write a Triton kernel now."),  # no tool call: a turn, an invalid call
                   Reply(tool_calls=[call("Read", file_path="model_new.py")]),
                   Reply(tool_calls=[call("Write", file_path="model_new.py", content=TRITON_SOLUTION), call("Finish")])],
        "tiny/b": [Reply(reasoning_content="nothing to do", tool_calls=[call("Finish")])],
    }
    source, output = tiny_tasks(tmp_path, "a", "b"), tmp_path / "run.jsonl"
    with ScriptedLLM(scripted(scripts)) as llm:
        args = ["eval", str(source), "--language", "triton", "--device", "cpu", "--base-url", llm.base_url,
                "--settings", SETTINGS_JSON, "--concurrency", "2", "--output", str(output), "--json"]
        first = runner.invoke(app, args)
        assert first.exit_code == 0, first.output
        asked_first = len(llm.requests)
        second = runner.invoke(app, args)
        assert second.exit_code == 0, second.output
        assert len(llm.requests) == asked_first == 4  # the rerun asked nothing: both tasks were done

    records = {r.task_id: r for r in read_records(output)}
    assert len(read_records(output)) == 2
    a, b = records["tiny/a"], records["tiny/b"]
    assert (a.stop, a.turns, a.tool_calls, a.invalid_calls, a.reward) == ("finished", 3, 4, 1, 1.0)
    nudge = a.messages[3]
    assert nudge["role"] == "user" and "invalid tool call" in nudge["content"] and "no tool call" in nudge["content"]
    # b finished at once: the starter is no solution. Its reasoning is kept in the record, not sent back.
    assert (b.stop, b.reward, b.final["correct"], b.invalid_calls) == ("finished", -1.0, False, 0)
    assert b.messages[2]["reasoning_content"] == "nothing to do"
    # RFT's filter (reward > 0, no invalid calls) is one line over the records, and here keeps nothing.
    assert [r.task_id for r in records.values() if (r.reward or 0) > 0 and r.invalid_calls == 0] == []

    summary = json.loads(second.stdout)
    assert (summary["selected"], summary["skipped"], summary["finished"]) == (2, 2, 0)
    overall = summary["metrics"]["overall"]
    assert (overall["tasks"], overall["pass_rate"], overall["mean_reward"]) == (2, 0.5, 0.0)
    assert overall["invalid_call_rate"] == pytest.approx(1 / 5)


def test_model_errors_are_retried_then_recorded_and_a_rerun_retries_the_task(tmp_path):
    task = Task(id="tiny/flaky", name="flaky", code=TINY_CODE)
    output = tmp_path / "run.jsonl"
    config = dict(language="triton", device="cpu", settings=SETTINGS, model_retries=2, retry_delay_s=0.01)

    def broken(request):
        raise RuntimeError("the GPU of the model server fell over")

    with ScriptedLLM(broken) as llm:
        summary = asyncio.run(run_agent_eval([task], AgentRunConfig(base_url=llm.base_url, **config), output))
    assert len(llm.requests) == 3  # one try and two retries
    [record] = read_records(output)
    assert record.stop == "error" and record.final is None and record.reward is None
    assert "after 3 tries" in record.error and "fell over" in record.error
    assert summary.errors == {"tiny/flaky": record.error}

    with ScriptedLLM.sequence([Reply(tool_calls=[call("Finish")])]) as llm:
        summary = asyncio.run(run_agent_eval([task], AgentRunConfig(base_url=llm.base_url, **config), output))
    assert summary.skipped == 0 and summary.finished == 1 and not summary.errors
    records = read_records(output)
    assert [r.stop for r in records] == ["error", "finished"]
    assert compute_metrics(records).overall.errors == 0  # the finished episode counts for the task


def test_the_context_budget_and_a_servers_context_refusal_end_an_episode_with_its_final_evaluation(tmp_path):
    """An episode whose conversation reaches the token budget, or that the server refuses as past
    the model's context (HTTP 400, as vLLM answers), ends as at the turn limit: the final
    evaluation of what is in the workspace, paid, recorded as "context_limit"."""
    tasks = [Task(id="tiny/budget", name="budget", code=TINY_CODE), Task(id="tiny/refused", name="refused", code=TINY_CODE)]
    write = Reply(tool_calls=[call("Read", file_path="model_new.py"),
                              call("Write", file_path="model_new.py", content=TRITON_SOLUTION)])

    def handler(request):
        task_id, turn = asked(request)
        if task_id == "tiny/refused" and turn == 1:
            raise Refused(400, "This model's maximum context length is 32768 tokens. However, you requested "
                               "40000 tokens in the messages. Please reduce the length of the messages.")
        return write

    output = tmp_path / "run.jsonl"
    with ScriptedLLM(handler) as llm:
        # The first call's prompt (the task, SKILL.md, the tools) alone is past a 1000-token budget.
        config = AgentRunConfig(base_url=llm.base_url, language="triton", device="cpu", settings=SETTINGS,
                                max_context_tokens=1000, model_retries=0)
        summary = asyncio.run(run_agent_eval(tasks[:1], config, output))
        config = dataclasses.replace(config, max_context_tokens=None)
        summary2 = asyncio.run(run_agent_eval(tasks[1:], config, output))
    assert summary.context_limit == 1 and summary2.context_limit == 1 and not summary2.errors
    budget, refused = read_records(output)
    for record in (budget, refused):
        assert (record.stop, record.turns, record.error) == ("context_limit", 1, None), record
        assert record.final["correct"] and record.reward == 1.0  # the solution written on the one turn, evaluated
        assert record.rollout["tool_calls"] == {"Read": 1, "Write": 1} and record.rollout["time_s"]["evaluations"] > 0
    assert budget.tokens["context"] >= 1000 and budget.tokens["completion"] > 0
    assert refused.tokens["prompt"] > 0  # the first call's, counted; the refused one has none
    assert len([r for r in llm.requests if asked(r)[0] == "tiny/budget"]) == 1


def test_a_server_that_goes_away_ends_the_run_and_keeps_what_finished(tmp_path):
    tasks = [Task(id=f"tiny/{n}", name=n, code=TINY_CODE) for n in ("first", "second")]
    output = tmp_path / "run.jsonl"
    holder: dict = {}

    def dying(request):
        server = holder["llm"]._server
        threading.Thread(target=lambda: (server.shutdown(), server.server_close())).start()
        raise RuntimeError("going away")

    config = AgentRunConfig(language="triton", device="cpu", settings=SETTINGS, concurrency=1, model_retries=3,
                            retry_delay_s=0.2)
    with ScriptedLLM(dying) as llm:
        holder["llm"] = llm
        with pytest.raises(ServerUnreachable, match="stopped answering.*rerun to resume"):
            asyncio.run(run_agent_eval(tasks, AgentRunConfig(**{**config.__dict__, "base_url": llm.base_url}), output))
    [record] = read_records(output)  # the second task never started: a rerun does it
    assert record.task_id == "tiny/first" and record.stop == "error" and "APIConnectionError" in record.error


# ============================================================================ usage and environment errors


def test_an_unreachable_server_is_an_environment_error_reported_at_once_and_writes_nothing(tmp_path):
    result = runner.invoke(app, ["eval", str(tiny_tasks(tmp_path, "a")), "--language", "triton", "--device", "cpu",
                                 "--base-url", "http://127.0.0.1:9/v1", "--output", str(tmp_path / "run.jsonl")])
    assert result.exit_code == 2
    assert "cannot reach the model server at http://127.0.0.1:9/v1" in result.output
    assert not (tmp_path / "run.jsonl").exists()
    started = time.monotonic()
    with pytest.raises(ServerUnreachable, match="cannot reach the model server"):
        asyncio.run(run_agent_eval([Task(id="tiny/a", name="a", code=TINY_CODE)],
                                   AgentRunConfig(base_url="http://127.0.0.1:9/v1", language="triton", device="cpu"),
                                   tmp_path / "out" / "run.jsonl"))
    assert time.monotonic() - started < 1.0, "a refused connection is reported without retries"
    assert not (tmp_path / "out").exists()


def test_a_model_the_server_does_not_serve_fails_before_any_episode(tmp_path):
    with ScriptedLLM(lambda request: Reply(tool_calls=[call("Finish")])) as llm:
        result = runner.invoke(app, ["eval", str(tiny_tasks(tmp_path, "a")), "--language", "triton", "--device", "cpu",
                                     "--base-url", llm.base_url, "--model", "gpt-nope", "--output",
                                     str(tmp_path / "run.jsonl")])
        assert llm.requests == []
    assert result.exit_code == 2, result.output
    assert "does not serve 'gpt-nope'; it serves scripted-model: pass one of them to --model" in result.output
    assert not (tmp_path / "run.jsonl").exists()


def test_an_address_without_v1_is_tried_with_it_and_a_wrong_one_names_the_fix():
    with ScriptedLLM(lambda request: Reply(content="hi")) as llm:
        root = llm.base_url.removesuffix("/v1")
        assert connect(root + "/", None, serve_hint="x") == Server(llm.base_url, "scripted-model")
        assert connect(llm.base_url, "scripted-model", serve_hint="x") == Server(llm.base_url, "scripted-model")
        with pytest.raises(RunError, match=r"did not list its models at .*/api/models or .*/api/v1/models \(HTTP 404\); "
                                           r"is the address right\? .* serve under /v1"):
            connect(root + "/api", None, serve_hint="x")


@pytest.mark.parametrize("args, message", [
    (["--settings", '{"timed_calls": "many"}'], "--settings: timed_calls"),
    (["--settings", '{"no_such": 1}'], "--settings: no_such"),
    (["--settings", "timed_calls=3"], "--settings: not JSON"),
    (["--name", "nothing-matches"], "no task matches"),
    (["--device", "cpu", "--language", "cuda"], "cuda kernels need a CUDA GPU"),
])
def test_bad_options_are_usage_errors(tmp_path, args, message):
    """Each is reported before any episode, the server answering (its check comes before the
    device's, which needs torch) or not (the checks that need neither come first)."""
    with ScriptedLLM(lambda request: Reply(tool_calls=[call("Finish")])) as llm:
        result = runner.invoke(app, ["eval", str(tiny_tasks(tmp_path, "a")), "--base-url", llm.base_url,
                                     "--output", str(tmp_path / "run.jsonl"), *args])
        assert llm.requests == []
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "run.jsonl").exists(), "a usage error wrote the output"


def test_an_output_that_is_not_a_run_file_is_refused_and_left_alone(tmp_path):
    output = tmp_path / "traces.json"
    output.write_text('[{"sample_key": "x"}]\n')
    result = runner.invoke(app, ["eval", str(tiny_tasks(tmp_path, "a")), "--language", "triton", "--device", "cpu",
                                 "--output", str(output)])
    assert result.exit_code == 2 and "not an episode record" in result.output
    assert output.read_text() == '[{"sample_key": "x"}]\n'
    report = runner.invoke(app, ["report", str(output)])
    assert report.exit_code == 2 and "is this a `kernel-env eval` output?" in report.output


def test_report_of_an_empty_run_file_says_so(tmp_path):
    (tmp_path / "run.jsonl").write_text("")
    result = runner.invoke(app, ["report", str(tmp_path / "run.jsonl")])
    assert result.exit_code == 2 and "no episode records" in result.output


# ============================================================================ pieces


def test_a_run_file_cuts_a_torn_last_line_and_retries_errors(tmp_path):
    done = EpisodeRecord(task_id="a", stop="finished", final={"correct": True}, reward=1.0).model_dump_json()
    failed = EpisodeRecord(task_id="b", stop="error", error="x").model_dump_json()
    path = tmp_path / "run.jsonl"
    path.write_text(done + "\n" + failed + "\n" + done[:30])
    run_file = RunFile(path).open()
    assert run_file.done == {"a"} and len(run_file.records) == 2
    run_file.append(EpisodeRecord(task_id="b", stop="turn_limit", final={"correct": False}, reward=-1.0))
    assert [r.task_id for r in read_records(path)] == ["a", "b", "b"] and RunFile(path).open().done == {"a", "b"}
    whole = tmp_path / "whole.jsonl"
    whole.write_text(done)  # a complete record whose newline was lost is kept
    assert [r.task_id for r in RunFile(whole).open().records] == ["a"] and whole.read_text() == done + "\n"


def test_an_episode_lost_to_an_evaluators_fault_is_not_done_and_a_rerun_retries_it(tmp_path):
    path = tmp_path / "run.jsonl"
    run_file = RunFile(path).open()
    run_file.append(EpisodeRecord(task_id="a", stop="evaluator_fault", error="the final evaluation failed by the "
                                  "evaluator's fault: the Ray worker running this job died twice", final={"fault": "evaluator"}))
    assert RunFile(path).open().done == set()


def test_assistant_and_tool_messages_keep_the_openai_format():
    from openai.types.chat import ChatCompletionMessage

    message = ChatCompletionMessage.model_validate({
        "role": "assistant", "content": None, "reasoning_content": "think",
        "tool_calls": [{"id": "", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]})
    kept = assistant_message(message, turn=4)
    assert kept == {"role": "assistant", "content": None, "reasoning_content": "think",
                    "tool_calls": [{"id": "call_4_0", "type": "function",
                                    "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]}
    assert "reasoning_content" not in request_message(kept) and request_message(kept)["tool_calls"] == kept["tool_calls"]
    assert tool_messages(kept["tool_calls"], [{"output": "a.txt"}]) == [
        {"role": "tool", "tool_call_id": "call_4_0", "content": "a.txt"}]
    with pytest.raises(RuntimeError, match="2 results to 1 tool calls"):
        tool_messages(kept["tool_calls"], [{"output": "a"}, {"output": "b"}])
