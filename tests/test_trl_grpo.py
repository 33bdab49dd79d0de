"""examples/train/trl_grpo.py on the CPU: TRL's GRPOTrainer updates a tiny random-weight model on
the rewards of KernelAgent-v0's trusted final evaluations (cpp, the relu_add example shrunk to
4096 elements, the tests' shortened timing protocol), saves it, and resumes from its checkpoint.

One training run of 2 steps crashes right after step 1's checkpoint; a second resumes from it to
step 2. Every assertion about the rewards, the saved model and the resume reads those two runs.
Each rollout's tool calls run in a real sandbox and each episode ends with the harness's final
evaluation (a build from scratch, the trials, the timing): 1 to 2 minutes on a shared 2-core box,
most of it C++ builds (with precompiled torch headers, made once for the session here, about half a
minute of that). The background final steps are also checked alone, on stand-in environments.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from statistics import mean
from types import SimpleNamespace

import pytest
from support import bubblewrap_skip_reason
from transformers import TrainerCallback

from kernel_env import headers
from kernel_env.resources import example_dir

pytestmark = pytest.mark.slow  # end to end: two GRPO training runs on real episodes

pytest.importorskip("trl", reason="the train extra (pip install -e '.[train]') is not installed")
_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train" / "trl_grpo.py"
_SPEC = importlib.util.spec_from_file_location("trl_grpo", _SCRIPT)
trl_grpo = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(trl_grpo)

GROUP = 4
STEPS = 2


def test_the_model_is_offered_the_environments_own_tool_descriptions():
    """TRL builds each tool's schema from its method; the text must be KernelAgent-v0's own."""
    from transformers.utils import get_json_schema

    from kernel_env.tools import TOOLS, openai_schema

    for name in trl_grpo.TOOL_NAMES:
        offered = get_json_schema(getattr(trl_grpo.KernelAgentTools, name))["function"]
        own = openai_schema(TOOLS[name])["function"]
        assert offered["name"] == name and offered["description"] == own["description"]
        for argument, schema in offered["parameters"]["properties"].items():
            assert schema["description"] == own["parameters"]["properties"][argument]["description"], (name, argument)
        assert offered["parameters"].get("required", []) == own["parameters"]["required"], name


# ----------------------------------------------------------------------------- background final steps


class StandIn:
    """An environment's surface as ``KernelAgentTools`` uses it; its final steps (Finish, truncate)
    wait at ``barrier`` (all of them at once, or none passes) and pay ``reward``."""

    def __init__(self, barrier: threading.Barrier, reward: float = 1.0, fault: str | None = None,
                 broken: bool = False):
        self.barrier, self.reward, self.fault, self.broken = barrier, reward, fault, broken
        self.episode, self.turn, self.closed = None, 0, False

    def reset(self, options: dict) -> tuple[str, dict]:
        self.episode, self.turn = object(), 0
        return "prompt", {}

    def step(self, action: dict) -> tuple:
        self.turn += 1
        if action["name"] != "Finish":
            return "ok", 0.0, False, False, self._info(final=False)
        return self._final(terminated=True)

    def truncate(self, reason: str) -> tuple:
        return self._final(terminated=False)

    def close(self) -> None:
        self.closed = True

    def _final(self, terminated: bool) -> tuple:
        self.barrier.wait(timeout=30)
        if self.broken:
            raise RuntimeError("the sandbox went away")
        faulted = self.fault == "evaluator"
        reward = 0.0 if faulted else self.reward
        return "report", reward, terminated and not faulted, not terminated or faulted, self._info(final=True)

    def _info(self, final: bool) -> dict:
        info = {"tool_results": [{"is_error": False}], "task_id": "t", "turn": self.turn, "invalid_calls": 0,
                "evaluations": []}
        return info | ({"final": {"reward": self.reward}, "fault": self.fault} if final else {})


def stand_ins(*envs: StandIn) -> tuple[object, list]:
    episodes = trl_grpo.Episodes()
    episodes.made = [trl_grpo.KernelAgentTools(env, episodes) for env in envs]
    for tools in episodes.made:
        tools.reset(task="t")
    return episodes, episodes.made


def test_final_steps_run_at_once_and_each_reward_is_its_own():
    """Two rollouts call Finish, two stop without it, one of them on an evaluator's fault: the four
    final steps run at the same time (each waits for the others at a barrier), and each reward and
    record is that episode's."""
    barrier = threading.Barrier(4)
    episodes, tools = stand_ins(StandIn(barrier, 2.0), StandIn(barrier, -1.0), StandIn(barrier, 1.0),
                                StandIn(barrier, 3.0, fault="evaluator"))
    tools[0].Write(file_path="a", content="")
    assert tools[0].Finish() == trl_grpo.FINISHED and tools[1].Finish() == trl_grpo.FINISHED
    for call in (lambda: tools[0].Bash(command="ls"), tools[0].Finish):  # after Finish nothing reaches the env
        with pytest.raises(trl_grpo.ToolCallError, match="has ended"):
            call()
    rewards = [t.get_reward() for t in tools]
    episodes.close()

    assert rewards == [2.0, -1.0, 1.0, None]
    assert [r["ended_by"] for r in episodes.records] == ["model", "model", "trainer", "trainer"]
    assert [r["turns"] for r in episodes.records] == [2, 1, 0, 0]
    assert all(t.env.closed for t in tools)


def test_a_failing_final_step_is_raised_not_swallowed():
    """A final step that raised surfaces in its get_reward; one no get_reward read, in close(),
    after every environment is closed."""
    barrier = threading.Barrier(2)
    episodes, tools = stand_ins(StandIn(barrier, broken=True), StandIn(barrier, broken=True))
    tools[0].Finish()
    tools[1].Finish()
    with pytest.raises(RuntimeError, match="the sandbox went away"):
        tools[0].get_reward()
    with pytest.raises(RuntimeError, match="the sandbox went away"):
        episodes.close()
    assert all(t.env.closed for t in tools)


# ----------------------------------------------------------------------------- training on real evaluations


@pytest.fixture(scope="module")
def precompiled_headers() -> None:
    """The cpp torch header, so that each final evaluation's build takes seconds, not half a minute."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
        proc = headers.precompile("cpp")
    assert proc.returncode == 0, proc.stdout + proc.stderr


class Crash(Exception):
    pass


class CrashAfterCheckpoint(TrainerCallback):
    """Breaks the run off right after a checkpoint is written, as a lost node would."""

    def on_save(self, args, state, control, **kwargs):
        raise Crash(f"crashed after checkpoint-{state.global_step}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, precompiled_headers) -> SimpleNamespace:
    """A 2-step run that crashes after step 1's checkpoint, then the same run resumed from it."""
    if bubblewrap_skip_reason():
        pytest.skip(bubblewrap_skip_reason())
    tmp = tmp_path_factory.mktemp("trl")
    task = tmp / "relu_add_4k.py"
    task.write_text((example_dir("relu_add") / "task.py").read_text().replace("1 << 24", "1 << 12"))
    argv = ["--task", str(task), "--language", "cpp", "--device", "cpu", "--short-protocol", "--steps", str(STEPS),
            "--num-generations", str(GROUP), "--max-turns", "20", "--max-tool-rounds", "2", "--save-steps", "1",
            "--output-dir", str(tmp / "out"), "--episodes-out", str(tmp / "episodes.jsonl")]
    args = trl_grpo.parse_args(argv)
    initial, tokenizer = trl_grpo.tiny_model(args.seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
        with pytest.raises(Crash, match="after checkpoint-1"):
            trl_grpo.run(args, *trl_grpo.tiny_model(args.seed), callbacks=[CrashAfterCheckpoint()])
        model, _ = trl_grpo.tiny_model(args.seed)  # its weights come from the checkpoint
        trainer, records = trl_grpo.run(trl_grpo.parse_args([*argv, "--resume"]), model, tokenizer)
    return SimpleNamespace(out=tmp / "out", initial=initial, tokenizer=tokenizer, model=model, trainer=trainer,
                           resumed=records,
                           episodes=[json.loads(line) for line in (tmp / "episodes.jsonl").read_text().splitlines()],
                           metrics=[json.loads(line) for line in (tmp / "out" / "metrics.jsonl").read_text().splitlines()])


def test_grpo_updates_the_model_on_rewards_from_the_trusted_final_evaluations(trained):
    # One record per rollout, written as each was scored, each reward what the harness's final
    # evaluation recorded for it.
    records = trained.episodes
    assert [record["step"] for record in records] == [1] * GROUP + [2] * GROUP  # step 1's survived the crash
    assert records[GROUP:] == trained.resumed
    for record in records:
        final = record["final"]
        assert final["mode"] == "final" and final["fault"] == (None if final["correct"] else "candidate"), final
        assert record["reward"] == final["reward"], record
        assert (record["reward"] > 0) == final["correct"], record  # a correct kernel is paid, anything else -1
        if final["correct"]:
            assert final["compiled"] and final["runtime_ms"] > 0, final
    assert {True, False} <= {record["final"]["correct"] for record in records}
    # Both solution actions write the same files but for the kernel: the verdict follows the sources.
    passed = {record["final"]["snapshot_hash"] for record in records if record["final"]["correct"]}
    failed = {record["final"]["snapshot_hash"] for record in records if record["final"]["compiled"]
              and not record["final"]["correct"]}
    assert len(passed) == 1 and not passed & failed, (passed, failed)
    # and the record says why the wrong one is wrong (the relu forgotten: the negative sums are off)
    assert all("elements outside atol" in record["final"]["mismatch"] for record in records
               if record["final"]["compiled"] and not record["final"]["correct"]), records
    assert any(record["ended_by"] == "model" for record in records), "no rollout called Finish"

    # TRL trained on exactly those rewards, step by step (step 1 in the crashed run's log, which the
    # checkpoint carried over), and at least one group differed.
    logged = [entry for entry in trained.trainer.state.log_history if "reward" in entry]
    groups = [records[step * GROUP:(step + 1) * GROUP] for step in range(STEPS)]
    assert [entry["step"] for entry in logged] == [1, 2]
    for entry, group in zip(logged, groups, strict=True):
        assert entry["reward"] == pytest.approx(mean(record["reward"] for record in group))
        assert entry["tools/call_frequency"] > 0
    assert any(len({record["reward"] for record in group}) > 1 for group in groups), groups


def test_the_trained_model_and_its_tokenizer_are_saved_and_load(trained):
    """The final model in --output-dir is the one trained: neither the initial weights nor step 1's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = dict(AutoModelForCausalLM.from_pretrained(trained.out).named_parameters())
    for name, param in trained.model.named_parameters():
        assert torch.equal(param.detach(), saved[name]), name
    for earlier in (trained.initial, AutoModelForCausalLM.from_pretrained(trained.out / "checkpoint-1")):
        assert any(not torch.equal(param.detach(), saved[name]) for name, param in earlier.named_parameters())

    tokenizer = AutoTokenizer.from_pretrained(trained.out)
    text = tokenizer.apply_chat_template([{"role": "assistant", "content": trl_grpo.action_tokens()[0]}], tokenize=False)
    assert tokenizer(text)["input_ids"] == trained.tokenizer(text)["input_ids"]


def test_a_crashed_run_resumes_from_its_checkpoint_and_logs_every_step_once(trained):
    """The resumed run started at step 2 (its rollouts are step 2's only) and checkpointed it;
    metrics.jsonl holds each step's logged entry once, across the two runs."""
    assert sorted(path.name for path in trained.out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert trained.trainer.state.global_step == STEPS
    assert [record["step"] for record in trained.resumed] == [2] * GROUP
    steps = [entry for entry in trained.metrics if "reward" in entry]
    logged = [entry for entry in trained.trainer.state.log_history if "reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    assert [entry["reward"] for entry in steps] == [entry["reward"] for entry in logged]
    assert all("step_time" in entry for entry in steps)
