"""GRPO on KernelAgent-v0 with TRL: multi-turn tool calls, the trusted final evaluation as the reward.

TRL's ``GRPOTrainer`` trains on environments through ``environment_factory``: a class whose
``reset`` returns the prompt, whose public methods are the tools the model calls (their schemas
come from each method's signature and docstring), and whose ``get_reward`` scores a finished
rollout. ``KernelAgentTools`` is that class around one in-process KernelAgent-v0 episode: the
trainer samples a turn, parses its tool calls, runs each one as a step of the episode (the
workspace, its sandbox and the evaluations are the environment's, exactly as in
``kernel_env.make``), appends the results and samples again, until the model stops calling tools
or its token budget is spent. ``get_reward`` then returns what the episode paid: the trusted
harness's final evaluation (``Finish``; a rollout that ended without it is truncated, so what its
workspace holds is rebuilt and evaluated the same way).

Two ways to run it::

    # CPU smoke run (what tests/test_trl_grpo.py runs): a random-weight 2-layer model built here,
    # whose vocabulary holds whole tool calls (see ``tiny_model``); a few optimiser steps on cpp.
    python examples/train/trl_grpo.py --task example/relu_add --language cpp --device cpu \\
        --steps 2 --num-generations 4 --max-tool-rounds 2 --short-protocol

    # A real model generating on a vLLM server (TRL's server mode), this process training on its
    # own GPU and the harness evaluating on two others (docs/trainers.md: the recipe, the flags):
    CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-8B --max-model-len 65536 \\
        --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1
    CUDA_VISIBLE_DEVICES=1,2,3 python examples/train/trl_grpo.py --model Qwen/Qwen3-8B \\
        --base-url http://localhost:8000 --harness-devices cuda:1,cuda:2 --task example/relu_add \\
        --steps 200 --num-generations 8 --max-completion-length 32768

``--episodes-out FILE`` writes one JSON line per finished episode: its reward and the final
evaluation's record (``EvalResult.summary()``), in the order TRL scored them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernel_env
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.runtime.pool import LocalPool
from kernel_env.tools import TOOLS, openai_schema

#: The tools a rollout may call: the methods of ``KernelAgentTools`` named after them.
TOOL_NAMES = ["Bash", "Read", "Write", "Edit", "Glob", "Grep", "Finish"]

#: The shortened protocol of the CPU tests: fewer timed calls and no torch.compile baseline.
SHORT_PROTOCOL = EvalSettings(timed_calls=5, min_timed_calls=5, warmup_calls=1, 
                              compile_baseline=False)


# ----------------------------------------------------------------------------- the environment


def documented(method: Callable) -> Callable:
    """Give a tool method the docstring TRL builds its schema from: the description and the
    parameters' descriptions of the KernelAgent-v0 tool's own schema (what ``info["tools"]`` holds)."""
    schema = openai_schema(TOOLS[method.__name__])["function"]
    properties = schema["parameters"]["properties"]
    params = [name for name in inspect.signature(method).parameters if name != "self"]
    lines = [f"    {name}: {properties[name]['description']}" for name in params]
    method.__doc__ = schema["description"] + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    return method


class ToolCallError(Exception):
    """A tool call the environment answered as an error: TRL shows the model its text and counts
    it in ``tools/failure_frequency``."""


class KernelAgentTools:
    """One KernelAgent-v0 episode per rollout, in TRL's ``environment_factory`` shape.

    TRL makes a few of these, reuses each across rollouts (``reset``), calls the tool methods with
    the arguments the model gave, and reads ``get_reward`` once per finished rollout. Every
    finished episode is appended to ``records``."""

    def __init__(self, env: Any, records: list[dict]):
        self.env = env
        self.records = records
        self.returned = 0.0
        self.info: dict[str, Any] = {}
        self.ended_by: str | None = None

    def reset(self, task: str, **row: Any) -> str:
        """Open a fresh episode on the row's task; its prompt is the rollout's first user message."""
        self.returned, self.info, self.ended_by = 0.0, {}, None
        prompt, _ = self.env.reset(options={"task": task})
        return prompt

    @documented
    def Bash(self, command: str, timeout: int | None = None) -> str:
        return self._step("Bash", command=command, timeout=timeout)

    @documented
    def Read(self, file_path: str, offset: int | None = None, limit: int | None = None) -> str:
        return self._step("Read", file_path=file_path, offset=offset, limit=limit)

    @documented
    def Write(self, file_path: str, content: str) -> str:
        return self._step("Write", file_path=file_path, content=content)

    @documented
    def Edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
        return self._step("Edit", file_path=file_path, old_string=old_string, new_string=new_string,
                          replace_all=replace_all)

    @documented
    def Glob(self, pattern: str, path: str | None = None) -> str:
        return self._step("Glob", pattern=pattern, path=path)

    @documented
    def Grep(self, pattern: str, path: str | None = None, glob: str | None = None) -> str:
        return self._step("Grep", pattern=pattern, path=path, glob=glob)

    @documented
    def Finish(self, summary: str = "") -> str:
        return self._step("Finish", summary=summary)

    def get_reward(self) -> float | None:
        """What the episode paid; None (TRL drops the rollout) when the evaluator was at fault.

        A rollout that ended without ``Finish`` (the model stopped calling tools, or its token or
        turn budget ran out) is truncated here (``env.truncate``), so its workspace gets the same
        final evaluation, paid the same way."""
        if self.ended_by is None:
            _, reward, _, _, self.info = self.env.truncate("The rollout ended without Finish (the trainer's budget).")
            self.returned += reward
            self.ended_by = "trainer"
        final = self.info["final"]
        reward = None if self.info["fault"] == "evaluator" else self.returned
        self.records.append({"task_id": self.info["task_id"], "reward": reward, "ended_by": self.ended_by,
                             "turns": self.info["turn"], "invalid_calls": self.info["invalid_calls"],
                             "evaluations": len(self.info["evaluations"]), "final": final})
        return reward

    def _step(self, name: str, **arguments: Any) -> str:
        """One tool call as one step of the episode; None arguments are left to the tool's defaults."""
        if self.ended_by is not None:
            raise ToolCallError("The episode has ended (its final evaluation is done): stop calling tools.")
        action = {"name": name, "arguments": {key: value for key, value in arguments.items() if value is not None}}
        observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.returned += reward
        if terminated or truncated:  # truncated: the turn limit, or the evaluator's fault (the env's words)
            self.ended_by = "model" if terminated else "truncated"
        if self.info["tool_results"][0]["is_error"]:
            raise ToolCallError(observation)
        return observation


class Episodes:
    """The ``environment_factory``: makes a ``KernelAgentTools`` on its own KernelAgent-v0, keeps
    them to close at the end, and holds the record of every finished episode."""

    def __init__(self, **env_options: Any):
        self.env_options = env_options
        self.made: list[KernelAgentTools] = []
        self.records: list[dict] = []

    def __call__(self) -> KernelAgentTools:
        tools = KernelAgentTools(kernel_env.make("KernelAgent-v0", tools=TOOL_NAMES, **self.env_options), self.records)
        self.made.append(tools)
        return tools

    def close(self) -> None:
        for tools in self.made:
            tools.env.close()


# ----------------------------------------------------------------------------- the tiny model


def tool_call(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3's chat template renders it, and as TRL's response parser reads it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def solution_calls(kernel: str) -> str:
    """The tool calls that put the bundled cpp solution of relu_add in place, with ``kernel`` as
    kernels/relu_add.cpp (model_new.py exists, so Write needs a Read of it first)."""
    solution = example_dir("relu_add") / "solutions" / "cpp"
    files = {"model_new.py": (solution / "model_new.py").read_text(), "kernels/relu_add.cpp": kernel,
             "kernels/relu_add_binding.cpp": (solution / "kernels" / "relu_add_binding.cpp").read_text()}
    calls = [tool_call("Read", file_path="model_new.py")]
    calls += [tool_call("Write", file_path=path, content=content) for path, content in files.items()]
    return "\n".join(calls)


def action_tokens() -> list[str]:
    """The tiny model's actions, one token each: the correct solution, the same with a kernel that
    forgets the relu (wrong on every negative sum), and Finish."""
    kernel = (example_dir("relu_add") / "solutions" / "cpp" / "kernels" / "relu_add.cpp").read_text()
    relu = "out[i] = v < 0.0f ? 0.0f : v;"
    if relu not in kernel:
        raise RuntimeError(f"the bundled relu_add kernel no longer holds {relu!r}: update trl_grpo.py")
    return [solution_calls(kernel), solution_calls(kernel.replace(relu, "out[i] = v;")), tool_call("Finish", summary="")]


def tiny_model(seed: int = 0) -> tuple[Any, Any]:
    """A random-weight 2-layer Qwen3 and a tokenizer made here (nothing is downloaded).

    The vocabulary is the chat template's structure (the role headers, the tool-response tags,
    the newline between messages), one token per action of ``action_tokens`` (each a whole
    tool-call block), and [UNK] for every other stretch of text: the task prompt and each tool
    result read as one [UNK] (a random-weight model reads nothing anyway, and short sequences keep
    the CPU run fast), while the assistant header decodes exactly, as TRL's response parser needs.
    A random model samples nearly uniformly, so rollouts differ: some write the correct kernel,
    some the wrong one, some neither, and the harness's final evaluations score them differently,
    which is what gives GRPO a non-zero advantage to learn from."""
    import torch
    import trl
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    structure = ["system\n", "user\n", "assistant\n", "<tool_response>\n", "\n</tool_response>"]
    words = ["[UNK]", "\n", *structure]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(map(re.escape, structure))), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")])
    backend.add_tokens([AddedToken(action, special=False, normalized=False) for action in action_tokens()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", padding_side="left")
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return Qwen3ForCausalLM(config), tokenizer


# ----------------------------------------------------------------------------- training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", action="append", help="a task spec (repeat for several; default example/relu_add)")
    parser.add_argument("--model", help="a model name or path (default: the tiny random-weight model built here)")
    parser.add_argument("--base-url", help="a vLLM server for generation (TRL's server mode), e.g. http://host:8000")
    parser.add_argument("--language", help="cuda | cpp | triton (default: the machine's)")
    parser.add_argument("--device", help="cuda | cpu: where the harness runs (default: the machine's)")
    parser.add_argument("--pool", choices=["local", "ray"], default="local", help="where evaluation jobs run")
    parser.add_argument("--harness-devices",
                        help="the local pool's devices, e.g. cuda:1,cuda:2 (default: every visible GPU, else the "
                             "CPU): keep them apart from the GPU this process trains on")
    parser.add_argument("--steps", type=int, default=2, help="optimiser steps")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per task and step (the GRPO group)")
    parser.add_argument("--max-turns", type=int, default=150, help="tool calls before an episode is truncated")
    parser.add_argument("--max-tool-rounds", type=int, default=None,
                        help="model turns whose tool calls are run, per rollout (default: until it stops)")
    parser.add_argument("--max-completion-length", type=int, default=1024,
                        help="tokens per rollout: every turn and tool result together")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--short-protocol", action="store_true",
                        help="the tests' shortened timing protocol (5 timed calls, no torch.compile baseline)")
    parser.add_argument("--output-dir", default="trl_grpo_output")
    parser.add_argument("--episodes-out", type=Path, help="write each finished episode's record here (JSON lines)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_trainer(args: argparse.Namespace, model: Any = None, tokenizer: Any = None) -> tuple[Any, Episodes]:
    """The GRPOTrainer and its environment factory. ``model``/``tokenizer`` default to
    ``args.model`` (loaded by TRL) or, without one, to ``tiny_model``."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    if model is None:
        model, tokenizer = (args.model, None) if args.model else tiny_model(args.seed)
    tasks = args.task or ["example/relu_add"]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(tasks), "task": tasks})
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=args.learning_rate, seed=args.seed,
        num_generations=args.num_generations, per_device_train_batch_size=args.num_generations,
        max_completion_length=args.max_completion_length, max_tool_calling_iterations=args.max_tool_rounds,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available(),
        use_vllm=bool(args.base_url), vllm_mode="server", vllm_server_base_url=args.base_url,
    )
    pool = LocalPool(devices=args.harness_devices.split(",")) if args.harness_devices else args.pool
    episodes = Episodes(language=args.language, device=args.device, pool=pool, max_turns=args.max_turns,
                        settings=SHORT_PROTOCOL if args.short_protocol else None)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                          environment_factory=episodes)
    return trainer, episodes


def run(args: argparse.Namespace, model: Any = None, tokenizer: Any = None) -> tuple[Any, list[dict]]:
    """Train; returns the trainer and the record of every finished episode, in scoring order."""
    trainer, episodes = build_trainer(args, model, tokenizer)
    try:
        trainer.train()
    finally:
        episodes.close()
        if args.episodes_out:
            args.episodes_out.write_text("".join(json.dumps(record) + "\n" for record in episodes.records))
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"step {entry['step']}: reward {entry['reward']:+.2f} (std {entry['reward_std']:.2f})")
    return trainer, episodes.records


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
