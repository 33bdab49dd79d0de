"""The OpenHands plug-in end to end on the CPU: a real OpenHands agent loop (openhands-sdk's Agent and
Conversation, litellm's HTTP client) whose model is a loopback server replaying a scripted solution.

The task is example/relu_add's code at 64k elements (16M would make each trusted evaluation take a
minute on a small CPU box) and the protocol is shortened; with ``speedup_margin=1.0`` no timing can
count as "faster", so the milestone of a correct solution is 1 in every run and comparing the
plug-in's reward with ``run_solution``'s tests the evaluation path, not this machine's timing noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: an OpenHands agent loop and trusted evaluations

pytest.importorskip("kernel_env.integrations.openhands",
                    reason="the OpenHands plug-in's extra is not installed: pip install 'kernel_env[openhands]'")

from typer.testing import CliRunner  # noqa: E402

import kernel_env  # noqa: E402
from kernel_env.cli import app  # noqa: E402
from kernel_env.cli.openhands import _litellm_model  # noqa: E402
from kernel_env.evaluators.records import EvalSettings  # noqa: E402
from kernel_env.integrations.openhands import KERNEL_TOOL_NAMES, KERNEL_TOOLS, KernelWorkspace  # noqa: E402
from kernel_env.resources import example_dir  # noqa: E402
from kernel_env.tasks import resolve_task  # noqa: E402
from kernel_env.tools import TOOLS  # noqa: E402
from scripted_llm import Reply, ScriptedLLM  # noqa: E402

SOLUTION_DIR = example_dir() / "solutions" / "cpp"
SOLUTION_FILES = ("model_new.py", "kernels/relu_add.cpp", "kernels/relu_add_binding.cpp")
SETTINGS = EvalSettings.short(speedup_margin=1.0)


def test_importing_the_plugin_leaves_torchs_log_level_so_nothing_prints_at_exit():
    """openhands-sdk lowers every logger at the root's level to INFO as it is imported, torch's among
    them; torch's exit-time INFO reports (TorchDynamo's traced frames and compile times) then printed
    as the process ended, after pytest's summary. The plug-in puts torch's level back."""
    import subprocess
    import sys

    code = ("import logging, torch, torch._dynamo\nimport kernel_env.integrations.openhands\n"
            "assert logging.getLogger('torch').level == logging.WARNING, logging.getLogger('torch').level\n"
            "torch.compile(lambda x: x + 1)(torch.ones(2))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TorchDynamo" not in run.stderr and "Metrics" not in run.stderr, run.stderr[-3000:]


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


#: The scripted model's turns: read the starter (Write wants a file read before it is replaced),
#: write the solution, compile, verify, finish.
SCRIPT = [
    Reply(content="Reading the starter first.", tool_calls=[call("Read", file_path="model_new.py")]),
    *(Reply(tool_calls=[call("Write", file_path=path, content=(SOLUTION_DIR / path).read_text())])
      for path in SOLUTION_FILES),
    Reply(tool_calls=[call("Bash", command="bash utils/compile.sh", timeout=600_000)]),
    Reply(tool_calls=[call("Bash", command="python3 -m utils.verification", timeout=600_000)]),
    Reply(tool_calls=[call("finish", message="ModelNew calls one fused C++ kernel; verification passed.")]),
]


def scripted_turn(request: dict) -> Reply:
    """The reply for the n-th model call, n = the assistant messages already in the request (so a
    retried request gets the same reply)."""
    turn = sum(message.get("role") == "assistant" for message in request["messages"])
    return SCRIPT[turn]


@pytest.fixture
def relu_add_task(tmp_path: Path) -> Path:
    path = tmp_path / "relu_add_64k.py"
    path.write_text((example_dir() / "task.py").read_text().replace("N = 1 << 24", "N = 1 << 16"))
    return path


def test_an_openhands_agent_run_gets_the_reward_run_solution_gives_for_the_same_files(relu_add_task, tmp_path):
    output = tmp_path / "run"
    with ScriptedLLM(scripted_turn) as llm:
        result = CliRunner().invoke(app, [
            "openhands", str(relu_add_task), "--model", "scripted-model", "--base-url", llm.base_url,
            "--language", "cpp", "--device", "cpu", "--max-iterations", "20", "--output", str(output),
            "--settings", SETTINGS.model_dump_json(), "--json"])
        requests = list(llm.requests)
    assert result.exit_code == 0, result.output
    assert len(requests) == len(SCRIPT)

    # The model saw kernel_env's tools (not Finish: OpenHands' finish ends the conversation), the
    # skill, and the task.
    offered = {tool["function"]["name"] for tool in requests[0]["tools"]}
    assert set(KERNEL_TOOL_NAMES) <= offered and "finish" in offered and "Finish" not in offered
    assert not offered & {"terminal", "file_editor"}
    system = requests[0]["messages"][0]["content"]
    system = system if isinstance(system, str) else "".join(part.get("text", "") for part in system)
    assert "<name>cpp</name>" in system
    assert "relu_add_64k" in json.dumps(requests[0]["messages"][1])

    # Every call ran in the sandbox: the build and the verification reported through the tools.
    events = json.loads((output / "events.json").read_text())
    observed = [e["observation"] for e in events if e.get("kind") == "ObservationEvent"]
    texts = ["".join(part["text"] for part in o["content"]) for o in observed]
    assert [o.get("tool") for o in observed] == ["Read", "Write", "Write", "Write", "Bash", "Bash", None]  # finish
    assert not any(o["is_error"] for o in observed), texts
    assert "BUILD OK" in texts[4] and "correctness: PASS" in texts[5]
    assert json.loads((output / "messages.json").read_text())[-1]["role"] == "tool"

    final = json.loads(result.stdout)
    assert final == json.loads((output / "result.json").read_text())
    assert final["ended"] == "finished" and final["mode"] == "final" and final["correct"]
    assert [e["mode"] for e in final["evaluations"]] == ["verify", "final"]

    build, expected = kernel_env.run_solution(resolve_task(str(relu_add_task)), SOLUTION_DIR, language="cpp",
                                              device="cpu", settings=SETTINGS)
    assert build.ok and expected.correct
    assert final["reward"] == final["episode_reward"] == expected.reward == 1.0


def test_the_model_server_and_model_are_checked_before_the_agent_starts(relu_add_task, tmp_path):
    with ScriptedLLM(scripted_turn) as llm:
        wrong = CliRunner().invoke(app, ["openhands", str(relu_add_task), "--model", "gpt-nope", "--base-url",
                                         llm.base_url, "--language", "cpp", "--device", "cpu",
                                         "--output", str(tmp_path / "run")])
        root = llm.base_url.removesuffix("/v1")
        assert _litellm_model("scripted-model", root, "EMPTY") == ("openai/scripted-model", llm.base_url)
        assert _litellm_model("openai/scripted-model", root, "EMPTY") == ("openai/scripted-model", llm.base_url)
        assert _litellm_model("anthropic/claude-x", root, "EMPTY") == ("anthropic/claude-x", root)  # litellm's to reach
        assert llm.requests == []  # no chat call: only the model list was read
    assert wrong.exit_code == 2, wrong.output
    assert "does not serve 'gpt-nope'; it serves scripted-model" in wrong.output
    assert not (tmp_path / "run").exists()


def test_the_workspace_runs_commands_and_file_transfers_in_the_sandbox(relu_add_task, tmp_path):
    with KernelWorkspace.open(str(relu_add_task), language="cpp", device="cpu", settings=SETTINGS) as workspace:
        host_dir = Path(workspace.working_dir)
        assert workspace.execute_command("pwd").stdout.strip() == workspace.sandbox_workdir == "/workspace"
        workspace.execute_command("cd kernels && export MARK=1")  # a subshell: the agent's shell is untouched
        shell = workspace.toolbox.run(call("Bash", command="pwd; echo ${MARK:-unset}")).output
        assert shell.split() == ["/workspace", "unset"]
        assert "compile.sh" in workspace.execute_command("ls", cwd=host_dir / "utils").stdout  # a host path, mapped

        (tmp_path / "note.txt").write_text("hello")
        assert workspace.file_upload(tmp_path / "note.txt", "kernels/note.txt").success
        assert workspace.file_download(f"{host_dir}/kernels/note.txt", tmp_path / "back.txt").success
        assert (tmp_path / "back.txt").read_text() == "hello"
        refused = workspace.file_upload(tmp_path / "note.txt", "model.py")  # protected: the sandbox refuses
        assert not refused.success and "model.py" in refused.error
        assert not workspace.file_download("/etc/hostname", tmp_path / "x").success
    assert not host_dir.exists()  # leaving the block ends the episode


def test_each_tool_definition_is_generated_from_the_kernel_env_tool_it_runs():
    for name, definition in KERNEL_TOOLS.items():
        tool = TOOLS[name]
        schema = definition.kernel_action.to_mcp_schema()
        aliases = {field.alias or key for key, field in tool.Args.model_fields.items()}
        assert definition.name == name and set(schema["properties"]) == aliases, name
        required = {field.alias or key for key, field in tool.Args.model_fields.items() if field.is_required()}
        assert set(schema.get("required", [])) == required, name
    assert KERNEL_TOOLS["Grep"].kernel_action.model_validate({"pattern": "x", "-i": True}).case_insensitive


def test_a_kernel_tool_refuses_a_workspace_that_is_not_a_sandbox(tmp_path):
    from openhands.sdk.workspace import LocalWorkspace

    class State:  # what ToolDefinition.create reads from a ConversationState
        workspace = LocalWorkspace(working_dir=tmp_path)

    with pytest.raises(ValueError, match="runs in a kernel_env sandbox"):
        KERNEL_TOOLS["Bash"].create(State())



@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_skill_states_the_default_checks_in_its_content_and_its_description(language):
    from kernel_env.integrations.openhands import kernel_skill

    skill = kernel_skill(language)
    for text in (skill.content, skill.description or ""):
        assert not any(mark in text for mark in ("{trials}", "{all_trials}", "{tolerance}", "{margin}", "{target}")), text
    assert "5% faster" in skill.content and "0.95 × the torch.compile time" in skill.content
