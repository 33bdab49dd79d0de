"""examples/train/trl_grpo.py on the CPU: TRL's GRPOTrainer updates a tiny random-weight model on
the rewards of KernelAgent-v0's trusted final evaluations (cpp, the relu_add example shrunk to
4096 elements, the tests' shortened timing protocol).

Each rollout's tool calls run in a real sandbox and each episode ends with the harness's final
evaluation (a build from scratch, the trials, the timing): 1.5 to 3 minutes on a shared 2-core box,
most of it C++ builds (with precompiled torch headers, made once for the session here, about half a
minute of that).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from statistics import mean

import pytest
from support import bubblewrap_skip_reason

from kernel_env import headers
from kernel_env.resources import example_dir

pytest.importorskip("trl", reason="the train extra (pip install 'kernel_env[train]') is not installed")
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


@pytest.fixture(scope="module")
def precompiled_headers() -> None:
    """The cpp torch header, so that each final evaluation's build takes seconds, not half a minute."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
        proc = headers.precompile("cpp")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
def test_grpo_updates_the_model_on_rewards_from_the_trusted_final_evaluations(tmp_path, monkeypatch,
                                                                                precompiled_headers):
    import torch

    monkeypatch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
    task = tmp_path / "relu_add_4k.py"
    task.write_text((example_dir("relu_add") / "task.py").read_text().replace("1 << 24", "1 << 12"))
    args = trl_grpo.parse_args([
        "--task", str(task), "--language", "cpp", "--device", "cpu", "--short-protocol",
        "--steps", str(STEPS), "--num-generations", str(GROUP), "--max-turns", "20", "--max-tool-rounds", "2",
        "--output-dir", str(tmp_path / "out"), "--episodes-out", str(tmp_path / "episodes.jsonl"),
    ])
    model, tokenizer = trl_grpo.tiny_model(args.seed)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}

    trainer, records = trl_grpo.run(args, model, tokenizer)

    # One record per rollout, each reward what the harness's final evaluation recorded for it.
    assert len(records) == STEPS * GROUP
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == len(records)
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
    assert any(record["ended_by"] == "model" for record in records), "no rollout called Finish"

    # TRL trained on exactly those rewards, step by step, and at least one group differed.
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    groups = [records[step * GROUP:(step + 1) * GROUP] for step in range(STEPS)]
    assert len(logged) == STEPS
    for entry, group in zip(logged, groups, strict=True):
        assert entry["reward"] == pytest.approx(mean(record["reward"] for record in group))
        assert entry["tools/call_frequency"] > 0
    assert any(len({record["reward"] for record in group}) > 1 for group in groups), groups

    changed = [name for name, param in model.named_parameters() if not torch.equal(param.detach(), before[name])]
    assert changed, "no weight changed"
