"""The trainer adapters on the CPU, each loaded by its own package: the verifiers environment through
``vf.load_environment`` and a real rollout (verifiers' client against a loopback server replaying a
scripted model), the skyrl-gym environment through ``skyrl_gym.make`` and the text a model would
send. Real sandboxes, the real pool and harness.

The verifiers rollout writes example/relu_add's cpp solution (its task at 64k elements) and ends in
a real final evaluation, a clean build included (about a minute of this file's two); with
``speedup_margin=1.0`` a correct solution's milestone is 1 on every machine. The other episodes are
Triton's, run by Triton's interpreter, so their final evaluations need no build: the skyrl-gym one
writes the Triton solution (the task at 4k elements), the verifiers ones that end early leave the
starter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import skyrl_gym
import verifiers as vf
from omegaconf import OmegaConf
from scripted_llm import Reply, ScriptedLLM
from support import FinalEvaluatorFault, bubblewrap_skip_reason

from kernel_env.evaluators.records import EvalSettings
from kernel_env.integrations import skyrl as kernel_skyrl
from kernel_env.integrations.verifiers import KernelEnv
from kernel_env.resources import example_dir
from kernel_env.tasks import Task
from kernel_env.tools import ALL_TOOL_NAMES
from kernel_env.workloads.runs.agent_eval import NUDGE, SYSTEM_PROMPT

TASK = Task(id="test/relu_add_64k", name="relu_add_64k",
            code=(example_dir() / "task.py").read_text().replace("N = 1 << 24", "N = 1 << 16"))
TASK_4K = Task(id="test/relu_add_4k", name="relu_add_4k",
               code=(example_dir() / "task.py").read_text().replace("N = 1 << 24", "N = 1 << 12"))
SOLUTION = example_dir() / "solutions" / "cpp"
TRITON_SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
SETTINGS = EvalSettings.short(speedup_margin=1.0)
API_KEY_VAR = "KERNEL_ENV_TEST_API_KEY"

pytestmark = [pytest.mark.slow,  # end to end: real sandboxes, episodes and trusted evaluations
              pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")]


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def write(path: str) -> dict:
    return call("Write", file_path=path, content=(SOLUTION / path).read_text())


#: The scripted model's turns: read the starter (Write wants a file read before it is replaced),
#: write the three files in one reply, answer once without a tool call, finish.
SCRIPT = [
    Reply(tool_calls=[call("Read", file_path="model_new.py")]),
    Reply(tool_calls=[write("model_new.py"), write("kernels/relu_add.cpp"), write("kernels/relu_add_binding.cpp")]),
    Reply(content="The solution is written."),
    Reply(tool_calls=[call("Finish")]),
]


def scripted_turn(request: dict) -> Reply:
    """The reply for the n-th model call, n = the assistant messages already in the request."""
    return SCRIPT[sum(message.get("role") == "assistant" for message in request["messages"])]


def load(tasks: list[Task] = [TASK], **options) -> KernelEnv:  # noqa: B006 - never changed
    return vf.load_environment("kernel_env.integrations.verifiers", tasks=tasks, device="cpu",
                               settings=SETTINGS.model_dump(), **{"language": "cpp", "max_turns": 10, **options})


def evaluate(env: KernelEnv, llm: ScriptedLLM) -> dict:
    """One rollout of the environment's one task through verifiers' own client and scoring."""
    client = vf.ClientConfig(api_base_url=llm.base_url, api_key_var=API_KEY_VAR, max_retries=0)
    results = env.evaluate_sync(client=client, model=llm.model, num_examples=1, rollouts_per_example=1,
                                state_columns=["kernel_env_info"])
    [output] = results["outputs"]
    return output


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv(API_KEY_VAR, "test")


# ----------------------------------------------------------------------------- verifiers


def test_verifiers_loads_a_dataset_of_the_tasks_with_kernel_envs_tools():
    env = load()
    assert isinstance(env, vf.MultiTurnEnv)
    [row] = env.get_dataset().to_list()
    assert row["info"] == {"task_id": TASK.id}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["prompt"][0]["content"] == SYSTEM_PROMPT
    assert [tool.name for tool in env.tool_defs] == list(ALL_TOOL_NAMES)
    with pytest.raises(RuntimeError, match="shaping"):  # a bad episode option fails at load, not in a rollout
        load(shaping="sometimes")


def test_a_verifiers_rollout_is_a_kernel_agent_episode_paid_by_the_final_evaluation():
    with ScriptedLLM(scripted_turn) as llm:
        output = evaluate(load(), llm)
        requests = list(llm.requests)

    assert output["error"] is None and output["stop_condition"] == "has_final_env_response"
    assert len(requests) == len(SCRIPT)
    # The model saw kernel_env's tools natively, the eval system prompt and the episode's own prompt.
    assert [tool["function"]["name"] for tool in requests[0]["tools"]] == list(ALL_TOOL_NAMES)
    system, user = requests[0]["messages"]
    assert system["content"] == SYSTEM_PROMPT
    assert user["content"].startswith(f"# Task {TASK.id}") and TASK.code.strip() in user["content"]
    # One tool message per call, under its id; a reply without a call is answered with the nudge.
    answered = [[m for m in request["messages"] if m["role"] == "tool"] for request in requests]
    assert [len(tools) for tools in answered] == [0, 1, 4, 4]
    assert [m["tool_call_id"] for m in answered[2][1:]] == ["call_2_0", "call_2_1", "call_2_2"]
    assert [m["content"].split()[:2] for m in answered[2][1:]] == [
        ["Overwrote", "model_new.py"], ["Created", "kernels/relu_add.cpp"], ["Created", "kernels/relu_add_binding.cpp"]]
    nudge = requests[3]["messages"][-1]
    assert nudge["role"] == "user" and nudge["content"].endswith(NUDGE)

    final = output["kernel_env_info"]["final"]
    assert final["mode"] == "final" and final["correct"], final
    assert output["reward"] == final["reward"] == 1.0
    assert output["metrics"]["correct"] == 1.0 and output["metrics"]["invalid_calls"] == 1.0


def test_vf_eval_serves_the_environment_and_a_rollout_stopped_for_a_budget_is_paid_its_final_evaluation(tmp_path):
    """verifiers' own CLI, as prime-rl runs an environment: loaded by its id and JSON arguments in a
    spawned env server. The completion-token budget stops the rollout before its first reply's
    calls run; the episode's final evaluation still runs, on the starter, and pays its -1."""
    task = tmp_path / "relu_add_64k.py"
    task.write_text(TASK.code)
    env_args = {"tasks": [str(task)], "language": "triton", "device": "cpu", "settings": SETTINGS.model_dump()}
    with ScriptedLLM.sequence([Reply(tool_calls=[call("Finish")])]) as llm:
        run = subprocess.run(
            [Path(sys.executable).parent / "vf-eval", "kernel_env.integrations.verifiers", "--env-args",
             json.dumps(env_args), "--extra-env-kwargs", json.dumps({"max_total_completion_tokens": 1}),
             "--api-base-url", llm.base_url, "--api-key-var", API_KEY_VAR, "--model", llm.model,
             "--num-examples", "1", "--rollouts-per-example", "1", "--state-columns", "kernel_env_info",
             "--save-results", "--output-dir", str(tmp_path / "out")],
            check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [results] = (tmp_path / "out").rglob("results.jsonl")
    [output] = [json.loads(line) for line in results.read_text().splitlines()]
    assert output["stop_condition"] == "max_total_completion_tokens_reached" and output["error"] is None
    final = output["kernel_env_info"]["final"]
    assert final["mode"] == "final" and not final["correct"]
    assert output["reward"] == -1.0 and output["kernel_env_info"]["turn"] == 0


def test_a_rollout_cut_by_its_timeout_lets_the_running_step_end_and_pay_then_is_truncated():
    """verifiers cancels a rollout at its timeout while a step still runs: the step ends first (its
    command puts the solution in place and verifies it: milestone 1, paid by shaping), then the
    final evaluation runs and settles; the rollout's reward is the episode's whole return."""
    env = load(tasks=[TASK_4K], language="triton", shaping="milestones")
    env.set_kwargs(timeout_seconds=6)
    command = "sleep 8 && cp solution.py model_new.py && python3 -m utils.verification"
    reply = Reply(tool_calls=[call("Write", file_path="solution.py", content=TRITON_SOLUTION),
                              call("Bash", command=command)])
    with ScriptedLLM.sequence([reply]) as llm:
        output = evaluate(env, llm)
    assert output["stop_condition"] == "timeout_reached" and output["error"] is None
    info = output["kernel_env_info"]
    assert info["turn"] == 1 and [e["mode"] for e in info["evaluations"]] == ["verify", "final"]
    assert info["final"]["correct"] and output["reward"] == 1.0


def test_an_evaluators_fault_is_the_rollouts_error_so_prime_rl_reschedules_it():
    with ScriptedLLM.sequence([Reply(tool_calls=[call("Finish")])]) as llm:
        output = evaluate(load(language="triton", pool=FinalEvaluatorFault()), llm)
    assert output["error"]["error"] == "InfraError" and "died twice" in output["error"]["error_chain_repr"]
    assert output["reward"] == 0.0 and output["kernel_env_info"]["fault"] == "evaluator"


# ----------------------------------------------------------------------------- skyrl-gym


def hermes(*calls: dict, thinking: str = "") -> str:
    """A reply as a Qwen-style model writes it: reasoning, then one <tool_call> block per call."""
    blocks = "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
    return f"{thinking}</think>\n\n{blocks}" if thinking else blocks


def test_tool_calls_are_read_from_the_replys_tool_call_blocks_after_its_reasoning():
    read = call("Read", file_path="model.py")
    assert kernel_skyrl.tool_calls(hermes(read, read)) == [json.dumps(read)] * 2
    assert kernel_skyrl.tool_calls(hermes(read, thinking="maybe <tool_call>{}</tool_call>?")) == [json.dumps(read)]
    assert kernel_skyrl.tool_calls("I am done.") == []


def test_skyrl_gym_makes_the_registered_env_and_an_episode_is_paid_by_the_final_evaluation():
    assert skyrl_gym.spec(kernel_skyrl.ENV_ID).entry_point == "kernel_env.integrations.skyrl:KernelAgentTextEnv"
    [row] = kernel_skyrl.dataset_rows([TASK_4K])
    config = OmegaConf.create({"language": "triton", "device": "cpu", "settings": SETTINGS.model_dump()})
    extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
    env = skyrl_gym.make(row["env_class"], env_config=config, extras={**extras, "max_turns": 10})
    try:
        prompt, _ = env.init(row["prompt"])
        assert prompt[0] == row["prompt"][0] and '"name": "Bash"' in prompt[0]["content"]
        assert prompt[1]["role"] == "user" and TASK_4K.code.strip() in prompt[1]["content"]
        assert env.max_turns == 10

        read = env.step(hermes(call("Read", file_path="model_new.py"), thinking="The starter first."))
        assert not read["done"] and read["reward"] == 0.0 and "class ModelNew" in read["observations"][0]["content"]
        wrote = env.step(hermes(call("Write", file_path="model_new.py", content=TRITON_SOLUTION),
                                call("Glob", pattern="model*.py")))
        written = wrote["observations"][0]["content"]
        assert "[1] Write:\nOverwrote model_new.py" in written and "[2] Glob" in written, written
        nudged = env.step("The solution is written.")
        assert nudged["observations"][0]["content"].endswith(NUDGE) and nudged["metadata"]["invalid_calls"] == 1
        done = env.step(hermes(call("Finish")))
        assert done["done"] and done["observations"] == []
        final = done["metadata"]["final"]
        assert final["mode"] == "final" and final["correct"] and done["reward"] == final["reward"] == 1.0
        assert env.get_metrics() == {"turns": 4, "invalid_calls": 1, "correct": 1.0, "evaluator_fault": 0.0}
    finally:
        env.close()
