"""KernelAgent-v0 end to end on the CPU: real sandboxes, the real pool and harness, scripted policies.

A tiny relu(x + y) task and the bundled Triton solution (run by Triton's interpreter on the CPU)
keep each trusted evaluation to seconds; the protocol is shortened (fewer timed calls, no
torch.compile baseline), everything else is what an RL rollout gets.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from support import FinalEvaluatorFault, bubblewrap_skip_reason

import kernel_env
from kernel_env.envs.agent import KernelAgentEnv
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.tasks import Task

TASK = Task(id="test/relu_add_4k", name="relu_add_4k", code=(example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12"))
SOLUTION = (example_dir() / "solutions" / "triton" / "model_new.py").read_text()
BROKEN = SOLUTION.replace("tl.where(v < 0, 0.0, v)", "v")  # forgets the relu: wrong on every negative sum
SETTINGS = EvalSettings.short()

pytestmark = pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")


def make_env(**options) -> KernelAgentEnv:
    return kernel_env.make("KernelAgent-v0", task=TASK, language="triton", device="cpu", settings=SETTINGS, **options)


@pytest.fixture
def env():
    env = make_env(max_turns=20)
    yield env
    env.close()


def write(path: str, content: str) -> dict:
    return {"name": "Write", "arguments": {"file_path": path, "content": content}}


def bash(command: str) -> dict:
    return {"name": "Bash", "arguments": {"command": command}}


READ_STARTER = {"name": "Read", "arguments": {"file_path": "model_new.py"}}
FINISH = {"name": "Finish", "arguments": {}}


def test_reset_gives_the_prompt_the_tools_and_the_workspace(env):
    obs, info = env.reset(seed=0)
    assert "# Task test/relu_add_4k" in obs and TASK.code.strip() in obs and "name: triton" in obs
    assert "- Finish:" in obs and "- Bash:" in obs
    names = [spec["function"]["name"] for spec in info["tools"]]
    assert names[0] == "Bash" and "Finish" in names
    assert Path(info["workspace_host_path"], "model.py").read_text() == TASK.code
    assert info["task_id"] == TASK.id and info["turn"] == 0


def test_a_tool_call_runs_in_the_sandbox_and_its_output_is_the_observation(env):
    env.reset()
    obs, reward, terminated, truncated, info = env.step(bash("echo hello from $(pwd)"))
    assert obs == "hello from /workspace" and reward == 0.0 and not (terminated or truncated)
    assert info["turn"] == 1 and info["tool_results"][0]["tool"] == "Bash" and info["invalid_calls"] == 0


@pytest.mark.parametrize("action", [None, b"\xff\xfe", "not json", 42, {"name": "NoSuchTool"},
                                    {"name": "Read", "arguments": {"file_path": 3}}, json.dumps({"name": "Read"}), [None, {}]])
def test_malformed_actions_answer_with_an_error_and_count_as_invalid(env, action):
    env.reset()
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs and reward == 0.0 and not (terminated or truncated)
    assert info["invalid_calls"] >= 1 and all(r["is_error"] for r in info["tool_results"])
    assert env.step(bash("echo still fine"))[0] == "still fine"


def test_a_list_of_calls_is_answered_in_order_under_headers(env):
    env.reset()
    obs, *_, info = env.step([bash("echo one"), {"name": "Glob", "arguments": {"pattern": "utils/*.sh"}}])
    assert obs.index("[1] Bash") < obs.index("one") < obs.index("[2] Glob") < obs.index("compile.sh")
    assert [r["tool"] for r in info["tool_results"]] == ["Bash", "Glob"]


def test_finish_rebuilds_evaluates_and_pays_the_final_milestone(env):
    env.reset()
    env.step(READ_STARTER)
    env.step(write("model_new.py", SOLUTION))
    obs, reward, terminated, truncated, info = env.step(FINISH)
    assert terminated and not truncated
    final = info["final"]
    assert final["correct"] and final["mode"] == "final" and final["runtime_ms"] > 0
    assert reward == final["reward"] == 1.0  # the interpreter is correct, never fast
    assert "FINAL EVALUATION" in obs and "correctness: PASS" in obs
    assert env.step(bash("ls"))[0].startswith("The episode has ended")


def test_the_turn_limit_truncates_with_a_final_evaluation_of_what_is_there():
    env = make_env(max_turns=2)
    try:
        env.reset()
        assert env.step(bash("true"))[3] is False
        obs, reward, terminated, truncated, info = env.step(bash("true"))
        assert truncated and not terminated
        assert reward == -1.0 and not info["final"]["correct"]  # the starter model_new.py is no solution
        assert "turn limit (2) was reached" in obs
    finally:
        env.close()


def test_the_rollout_accounts_calls_and_time_and_a_trainers_budget_truncates_with_a_final_evaluation(env):
    started = time.monotonic()
    env.reset()
    time.sleep(0.3)  # the model thinking
    env.step(READ_STARTER)
    env.step([bash("ls kernels"), bash("ls kernels")])  # the second repeats the first, output and all
    env.step({"name": "Read", "arguments": {"file_path": "no_such_file.py"}})  # a valid call that fails
    env.step({"name": "NoSuchTool", "arguments": {}})  # an invalid one
    env.step(write("model_new.py", SOLUTION))
    _, _, _, _, info = env.step(bash("python3 -m utils.verification"))
    assert info["evaluations"][-1]["correct"]
    obs, reward, terminated, truncated, info = env.truncate("The context budget (128 tokens) was reached.")
    wall = time.monotonic() - started
    assert truncated and not terminated and reward == 1.0 and info["final"]["correct"]
    assert obs.endswith("The context budget (128 tokens) was reached.") and "FINAL EVALUATION" in obs
    rollout = info["rollout"]
    assert rollout["tool_calls"] == {"Read": 2, "Bash": 3, "NoSuchTool": 1, "Write": 1}
    assert (rollout["tool_errors"], rollout["invalid_calls"], rollout["repeated_calls"]) == (1, 1, 1)
    assert info["invalid_calls"] == 1
    seconds = rollout["time_s"]
    assert seconds["model"] >= 0.3 and seconds["evaluations"] > 0 and seconds["builds"] > 0 and seconds["tools"] > 0
    assert sum(seconds.values()) <= wall + 0.01  # nothing counted twice
    assert env.truncate("again")[0].startswith("The episode has ended")


def test_calls_after_finish_in_the_same_action_are_not_run(env):
    env.reset()
    obs, reward, terminated, truncated, info = env.step([FINISH, bash("echo never")])
    assert terminated and "not run: Finish was called" in obs and "never" not in obs.replace("echo never", "")


def test_best_selection_counts_the_best_verified_solution_not_a_later_broken_one():
    for selection, expected in (("best", 1.0), ("final", -1.0)):
        env = make_env(max_turns=10, selection=selection)
        try:
            env.reset()
            env.step(READ_STARTER)
            env.step(write("model_new.py", SOLUTION))
            assert "correctness: PASS" in env.step(bash("python3 -m utils.verification"))[0]
            env.step(READ_STARTER)
            env.step(write("model_new.py", BROKEN))
            *_, reward, terminated, _, info = env.step(FINISH)
            assert reward == expected, (selection, info["final"])
            if selection == "best":  # the workspace is left holding the solution that counted
                assert Path(env.episode.workspace.path, "model_new.py").read_text() == SOLUTION
        finally:
            env.close()


def test_milestone_shaping_pays_when_first_reached_and_sums_to_the_final_reward():
    env = make_env(max_turns=10, shaping="milestones")
    try:
        env.reset()
        env.step(READ_STARTER)
        rewards = [env.step(write("model_new.py", SOLUTION))[1]]
        rewards.append(env.step(bash("python3 -m utils.verification"))[1])   # first correct: milestone 1
        rewards.append(env.step(bash("python3 -m utils.verification"))[1])   # reached before: nothing new
        *_, reward, terminated, _, info = env.step(FINISH)
        rewards.append(reward)
        assert rewards[:3] == [0.0, 1.0, 0.0]
        assert sum(rewards) == info["final"]["reward"] == 1.0 and rewards[-1] == 0.0
    finally:
        env.close()


def test_an_evaluators_fault_in_the_final_evaluation_is_never_paid():
    """Evaluated once more, then the episode is truncated with nothing settled: the milestone paid
    by shaping stays, no -1 is paid for a correct kernel, and info names the fault."""
    pool = FinalEvaluatorFault()
    env = make_env(max_turns=10, shaping="milestones", pool=pool)
    try:
        env.reset()
        env.step(READ_STARTER)
        env.step(write("model_new.py", SOLUTION))
        assert env.step(bash("python3 -m utils.verification"))[1] == 1.0
        observation, reward, terminated, truncated, info = env.step(FINISH)
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["fault"] == "evaluator" and info["final"]["fault"] == "evaluator" and info["final"]["reward"] is None
        assert "EVALUATOR FAULT" in observation and pool.finals == 2
    finally:
        env.close()


def test_what_the_agent_left_running_cannot_touch_the_final_build(env):
    env.reset()
    env.step(READ_STARTER)
    env.step(write("model_new.py", SOLUTION))
    # A background loop that keeps overwriting the solution with a broken one (as a rollout could by
    # accident): the final evaluation must see the solution as it was at Finish.
    env.step(write("broken.py", BROKEN))
    env.step({"name": "Bash", "arguments": {"command": "(sleep 1; while :; do cp broken.py model_new.py; sleep 0.05; done) &"}})
    *_, reward, terminated, _, info = env.step(FINISH)
    assert reward == 1.0 and info["final"]["correct"], info["final"]


def test_check_env_and_gymnasium_make():
    env = gymnasium.make("kernel_env/KernelAgent-v0", task=TASK, language="triton", device="cpu", max_turns=50)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_async_episodes_run_concurrently_in_one_event_loop():
    envs = [make_env(max_turns=5) for _ in range(6)]

    async def main() -> tuple[list[str], float]:
        await asyncio.gather(*(env.areset() for env in envs))
        started = asyncio.get_running_loop().time()
        steps = await asyncio.gather(*(env.astep(bash(f"sleep 1; echo episode {i}")) for i, env in enumerate(envs)))
        return [obs for obs, *_ in steps], asyncio.get_running_loop().time() - started

    try:
        outputs, elapsed = asyncio.run(main())
    finally:
        for env in envs:
            env.close()
    assert outputs == [f"episode {i}" for i in range(6)]
    assert elapsed < 4.0, f"six one-second commands took {elapsed:.1f}s: they did not overlap"


@pytest.mark.parametrize("gpus, named, expected", [
    ([], {}, ("cpp", "cpu")),
    ([], {"language": "triton"}, ("triton", "cpu")),
    (["cuda:0"], {}, ("cuda", "cuda")),
    (["cuda:0"], {"device": "cpu"}, ("cpp", "cpu")),
    (["cuda:0"], {"language": "triton"}, ("triton", "cuda")),
])
@pytest.mark.parametrize("name", ["KernelAgent-v0", "KernelRefine-v0"])
def test_the_language_and_device_follow_the_machine_unless_named(monkeypatch, name, gpus, named, expected):
    """One rule for both environments, Episode.open and the workloads: cuda on a GPU machine, cpp
    on the CPU; naming one of the two changes only that one."""
    from kernel_env.runtime import episode

    monkeypatch.setattr(episode, "visible_gpus", lambda: gpus)
    env = kernel_env.make(name, task=TASK, **named)
    assert (env.language, env.device) == expected
    assert episode.language_and_device(named.get("language"), named.get("device")) == expected


def test_unknown_options_fail_at_construction():
    with pytest.raises(ValueError, match="selection"):
        make_env(selection="first")
    with pytest.raises(ValueError, match="shaping"):
        make_env(shaping="dense")
    with pytest.raises(ValueError, match="needs reward_kind='milestone'"):
        make_env(shaping="milestones", reward_kind="speedup")
    with pytest.raises(ValueError, match="unknown language 'fortran'"):
        KernelAgentEnv(TASK, language="fortran", device="cpu")
    with pytest.raises(ValueError, match="max_turns"):
        make_env(max_turns=0)
    with pytest.raises(ValueError, match="unknown environment"):
        kernel_env.make("KernelAgent-v9")
