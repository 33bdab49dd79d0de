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
workspace holds is rebuilt and evaluated the same way). The final evaluations run in the
background, several at once (``KernelAgentTools`` says how and why that changes no reward).

Two ways to run it::

    # CPU smoke run (what tests/test_trl_grpo.py runs): a random-weight 2-layer model built here,
    # whose vocabulary holds whole tool calls (see ``tiny_model``); a few optimiser steps on cpp.
    .venv/bin/python examples/train/trl_grpo.py --task example/relu_add --language cpp --device cpu \\
        --steps 2 --num-generations 4 --max-tool-rounds 2 --short-protocol

    # A real model generating on a vLLM server (TRL's server mode), this process training on its
    # own GPU and the harness evaluating on two others (docs/trainers.md: the recipe, the flags):
    CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-8B --max-model-len 65536 \\
        --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1
    CUDA_VISIBLE_DEVICES=1,2,3 .venv/bin/python examples/train/trl_grpo.py --model Qwen/Qwen3-8B \\
        --base-url http://localhost:8000 --harness-devices cuda:1,cuda:2 --task example/relu_add \\
        --steps 200 --num-generations 8 --max-completion-length 32768 --output-dir qwen3_8b_grpo

What a run keeps, in ``--output-dir``: a checkpoint every ``--save-steps`` steps and at the end
(``checkpoint-N``: weights, optimiser, scheduler, RNG and trainer state; the newest
``--save-total-limit`` kept), the final model and tokenizer (``from_pretrained(output_dir)``
loads them), and ``metrics.jsonl``, every logged entry as a JSON line (``--report-to`` sends them
to a tracker too). ``--resume`` continues from the newest checkpoint there (``--resume PATH``:
that one), appending to ``metrics.jsonl`` and ``--episodes-out``. ``--episodes-out FILE`` gets one
JSON line per finished episode as TRL scores it: the step it was generated for, its reward and the
final evaluation's record (``EvalResult.summary()``). After a resume, the steps between the
checkpoint and the crash appear twice: the later lines are the ones the model trained on.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import re
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from transformers import TrainerCallback

import kernel_env
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import language_and_device
from kernel_env.runtime.pool import LocalPool
from kernel_env.tools import TOOLS, openai_schema

#: The tools a rollout may call: the methods of ``KernelAgentTools`` named after them.
TOOL_NAMES = ["Bash", "Read", "Write", "Edit", "Glob", "Grep", "Finish"]

#: The shortened protocol of the CPU tests: fewer timed calls and no torch.compile baseline.
SHORT_PROTOCOL = EvalSettings.short()

#: What ``Finish`` answers: the episode is over, its final step is running in the background.
FINISHED = ("Finished: the episode is over. Your solution is now rebuilt from scratch and evaluated by the trusted "
            "harness, and that evaluation is your result; nothing you call or write from here on is run or counted.")

#: Why an episode the rollout left open ends (``env.truncate``): the trainer's budget, not the model.
TRAINER_ENDING = "The rollout ended without Finish (the trainer's budget)."

#: Threads for the episodes' final steps in the background. They mostly wait (on the sandbox's
#: clean rebuild, on the pool's queue); the pool bounds how many evaluations run at once.
FINAL_STEP_THREADS = 256

#: Where ``--resume`` without a path looks: the newest ``checkpoint-N`` of ``--output-dir``.
NEWEST = "newest"


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


#: A step's answer: (observation, reward, terminated, truncated, info).
Answer = tuple[str, float, bool, bool, dict[str, Any]]


class KernelAgentTools:
    """One KernelAgent-v0 episode per rollout, in TRL's ``environment_factory`` shape.

    TRL makes a few of these, reuses each across rollouts (``reset``), calls the tool methods with
    the arguments the model gave, and reads ``get_reward`` once per finished rollout, after the
    whole batch has been generated. Its methods other than the tools are private: TRL offers
    every public one to the model.

    The final step of an episode (the clean rebuild and the trusted evaluation: seconds to minutes)
    runs in the background on ``Episodes``' threads, so that the batch's episodes are evaluated
    at once rather than one after another. TRL calls one rollout's tools at a time and needs each
    result before the next, so only what no rollout waits for can overlap: ``Finish`` starts the
    final step and answers at once (``FINISHED``); the batch's first ``get_reward`` starts it for
    every episode still open (``env.truncate``), and each ``get_reward`` waits for its own.

    Deferring the final report costs the training nothing: after ``Finish`` the episode is over,
    nothing the model does afterwards is run or paid (later tool calls are refused without
    reaching the environment), the report's tokens are a tool result, which TRL masks out of the
    loss, and the reward is the same number, read from the same final step, only later. The one
    ending not deferred is the turn limit's, a tool call whose output the model must see first."""

    def __init__(self, env: Any, episodes: Episodes):
        self.env = env
        self.episodes = episodes
        self.returned = 0.0
        self.info: dict[str, Any] = {}
        self.ended_by: str | None = None
        self.ending: Future[Answer] | None = None  # the final step, running in the background
        self.ending_cause = ""

    def reset(self, task: str, **row: Any) -> str:
        """Open a fresh episode on the row's task; its prompt is the rollout's first user message."""
        if self.ending is not None:  # a final step no reward was read of: it must not race the reset
            self.ending.result()
        self.returned, self.info, self.ended_by, self.ending = 0.0, {}, None, None
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
        self._check_open()
        action = self._action("Finish", summary=summary)
        try:
            TOOLS["Finish"].Args.model_validate(action["arguments"])
        except ValidationError:  # a call the env answers as invalid, and the episode goes on
            return self._step("Finish", summary=summary)
        self._end(functools.partial(self.env.step, action), cause="model")
        return FINISHED

    def get_reward(self) -> float | None:
        """What the episode paid; None (TRL drops the rollout) when the evaluator was at fault.

        The batch's first call starts the final step of every episode still open: rollouts that
        ended without ``Finish`` (the model stopped calling tools, or its token or turn budget ran
        out) are truncated (``env.truncate``), so their workspace gets the same final evaluation,
        paid the same way. Each call then waits for its own episode's final step, and raises what
        that step raised."""
        self.episodes.end_open()
        if self.ending is not None:
            answer, self.ending = self.ending.result(), None
            self._take(answer, cause=self.ending_cause)
        final = self.info["final"]
        reward = None if self.info["fault"] == "evaluator" else self.returned
        self.episodes.record({"task_id": self.info["task_id"], "step": self.episodes.step, "reward": reward,
                               "ended_by": self.ended_by, "turns": self.info["turn"],
                               "invalid_calls": self.info["invalid_calls"],
                               "evaluations": len(self.info["evaluations"]), "final": final})
        return reward

    @property
    def _open(self) -> bool:
        """An episode is open from its reset until its final step starts."""
        return self.env.episode is not None and self.ended_by is None and self.ending is None

    def _action(self, name: str, **arguments: Any) -> dict[str, Any]:
        """One tool call as an action; None arguments are left to the tool's defaults."""
        return {"name": name, "arguments": {key: value for key, value in arguments.items() if value is not None}}

    def _check_open(self) -> None:
        """Refuse a call after the episode's end, without reaching the environment (its final step may be running)."""
        if not self._open:
            raise ToolCallError("The episode has ended (Finish, or its turn limit): stop calling tools.")

    def _step(self, name: str, **arguments: Any) -> str:
        """One tool call as one step of the episode."""
        self._check_open()
        observation = self._take(self.env.step(self._action(name, **arguments)), cause="model")
        if self.info["tool_results"][0]["is_error"]:
            raise ToolCallError(observation)
        return observation

    def _end(self, final_step: Callable[[], Answer], cause: str) -> None:
        """Start the episode's final step in the background; ``cause`` says who ended it (``_take``)."""
        self.ending, self.ending_cause = self.episodes.threads.submit(final_step), cause

    def _take(self, answer: Answer, cause: str) -> str:
        """Account one step's answer. One that ends the episode says who ended it: ``cause`` (the
        model by Finish, the trainer by truncating), or "truncated" when a step of the model's ended
        truncated (the turn limit, or the evaluator's fault: the env's words)."""
        observation, reward, terminated, truncated, self.info = answer
        self.returned += reward
        if terminated or truncated:
            self.ended_by = cause if terminated or cause == "trainer" else "truncated"
        return observation


class Episodes:
    """The ``environment_factory``: makes a ``KernelAgentTools`` on its own KernelAgent-v0, runs
    their final steps on its threads, and records every finished episode: in ``records``, and as
    a JSON line appended to ``out`` as soon as it is scored (a crash loses none).

    ``step`` is the optimiser step whose rollouts are being generated (``RunLog`` keeps it); each
    record carries it."""

    def __init__(self, out: Path | None = None, **env_options: Any):
        self.out = out
        self.env_options = env_options
        self.made: list[KernelAgentTools] = []
        self.records: list[dict] = []
        self.step = 0
        self.threads = ThreadPoolExecutor(FINAL_STEP_THREADS, thread_name_prefix="trl_grpo-final-step")

    def __call__(self) -> KernelAgentTools:
        tools = KernelAgentTools(kernel_env.make("KernelAgent-v0", tools=TOOL_NAMES, **self.env_options), self)
        self.made.append(tools)
        return tools

    def close(self) -> None:
        """Wait for the final steps still running, close every environment, then raise what a
        final step raised that no ``get_reward`` read (a crash mid-batch leaves some unread)."""
        self.threads.shutdown(wait=True)
        try:
            for tools in self.made:
                if tools.ending is not None:
                    tools.ending.result()
        finally:
            for tools in self.made:
                tools.env.close()

    def end_open(self) -> None:
        """Truncate every episode still open, each in the background: they are evaluated at once."""
        for tools in self.made:
            if tools._open:
                tools._end(functools.partial(tools.env.truncate, TRAINER_ENDING), cause="trainer")

    def record(self, record: dict) -> None:
        self.records.append(record)
        if self.out:
            with self.out.open("a") as out:
                out.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------- the tiny model


def tool_call(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3's chat template renders it, and as TRL's response parser reads it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


#: Per language, the line of the bundled relu_add solution that applies the relu, and that line without it.
RELU_LINES = {"cpp": ("out[i] = v < 0.0f ? 0.0f : v;", "out[i] = v;"),
              "cuda": ("return v < 0.0f ? 0.0f : v;", "return v;"),
              "triton": ("tl.where(v < 0, 0.0, v)", "v")}


def solution_calls(language: str, forget_relu: bool = False) -> str:
    """The tool calls that put the bundled ``language`` solution of relu_add in place (model_new.py
    exists in the workspace, so its Write needs a Read first); with ``forget_relu``, its relu line
    without the relu: a kernel that builds and runs and is wrong on every negative sum."""
    solution = example_dir("relu_add") / "solutions" / language
    files = {path.relative_to(solution).as_posix(): path.read_text() for path in sorted(solution.rglob("*"))
             if path.is_file() and "__pycache__" not in path.parts}
    if forget_relu:
        relu, without = RELU_LINES[language]
        [name] = [name for name, text in files.items() if relu in text] or [None]
        if name is None:
            raise RuntimeError(f"the bundled {language} relu_add solution no longer holds {relu!r}: update trl_grpo.py")
        files[name] = files[name].replace(relu, without)
    calls = [tool_call("Read", file_path="model_new.py")]
    calls += [tool_call("Write", file_path=path, content=content) for path, content in files.items()]
    return "\n".join(calls)


def action_tokens(language: str = "cpp") -> list[str]:
    """The tiny model's actions, one token each: the correct solution, the same with a kernel that
    forgets the relu, and Finish."""
    return [solution_calls(language), solution_calls(language, forget_relu=True), tool_call("Finish", summary="")]


def tiny_model(seed: int = 0, language: str = "cpp") -> tuple[Any, Any]:
    """A random-weight 2-layer Qwen3 and a tokenizer made here (nothing is downloaded), acting in ``language``.

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
    backend.add_tokens([AddedToken(action, special=False, normalized=False) for action in action_tokens(language)])
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
    parser.add_argument("--output-dir", default="trl_grpo_output",
                        help="checkpoints, the final model and tokenizer, metrics.jsonl")
    parser.add_argument("--save-steps", type=int, default=50, help="a checkpoint every N steps (and at the end)")
    parser.add_argument("--save-total-limit", type=int, default=2, help="checkpoints kept (the newest)")
    parser.add_argument("--resume", nargs="?", const=NEWEST, metavar="CHECKPOINT",
                        help="continue from the newest checkpoint in --output-dir (none there: start afresh), or "
                             "from CHECKPOINT; --steps is the total, counted from the first step")
    parser.add_argument("--report-to", default="none",
                        help="trackers for the logged metrics, comma-separated (wandb, tensorboard, trackio, ...)")
    parser.add_argument("--episodes-out", type=Path,
                        help="append each finished episode's record here (JSON lines; a run without --resume "
                             "starts it afresh)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class RunLog(TrainerCallback):
    """Appends every logged entry to ``<output_dir>/metrics.jsonl`` (with its step), and tells
    ``Episodes`` which step's rollouts are being generated."""

    def __init__(self, path: Path, episodes: Episodes):
        self.path, self.episodes = path, episodes

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.episodes.step = state.global_step + 1

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            with self.path.open("a") as out:
                out.write(json.dumps({"step": state.global_step, **logs}) + "\n")


def checkpoint_to_resume(args: argparse.Namespace) -> str | None:
    """The checkpoint ``--resume`` names: its path, or the newest in ``--output-dir`` (None there: start afresh)."""
    from transformers.trainer_utils import get_last_checkpoint

    if args.resume != NEWEST:
        return args.resume
    newest = get_last_checkpoint(args.output_dir) if Path(args.output_dir).is_dir() else None
    print(f"resuming from {newest}" if newest else f"no checkpoint in {args.output_dir}: starting afresh")
    return newest


def build_trainer(args: argparse.Namespace, model: Any = None, tokenizer: Any = None,
                  callbacks: list | None = None) -> tuple[Any, Episodes]:
    """The GRPOTrainer and its environment factory. ``model``/``tokenizer`` default to
    ``args.model`` (loaded by TRL) or, without one, to ``tiny_model``; ``callbacks`` are more
    ``TrainerCallback``s. A run without ``--resume`` starts ``metrics.jsonl`` and ``--episodes-out``
    afresh; one with it appends to them."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    if model is None:
        model, tokenizer = (args.model, None) if args.model else \
            tiny_model(args.seed, language_and_device(args.language, args.device)[0])
    tasks = args.task or ["example/relu_add"]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(tasks), "task": tasks})
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=args.learning_rate, seed=args.seed,
        num_generations=args.num_generations, per_device_train_batch_size=args.num_generations,
        max_completion_length=args.max_completion_length, max_tool_calling_iterations=args.max_tool_rounds,
        logging_steps=1, save_strategy="steps", save_steps=args.save_steps, save_total_limit=args.save_total_limit,
        report_to=args.report_to.split(","), use_cpu=not torch.cuda.is_available(),
        use_vllm=bool(args.base_url), vllm_mode="server", vllm_server_base_url=args.base_url,
    )
    metrics = Path(args.output_dir) / "metrics.jsonl"
    for log in filter(None, (metrics, args.episodes_out)):
        log.parent.mkdir(parents=True, exist_ok=True)
        if args.resume is None:
            log.unlink(missing_ok=True)
    pool = LocalPool(devices=args.harness_devices.split(",")) if args.harness_devices else args.pool
    episodes = Episodes(out=args.episodes_out, language=args.language, device=args.device, pool=pool,
                        max_turns=args.max_turns, settings=SHORT_PROTOCOL if args.short_protocol else None)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                          environment_factory=episodes, callbacks=[RunLog(metrics, episodes), *(callbacks or [])])
    return trainer, episodes


def run(args: argparse.Namespace, model: Any = None, tokenizer: Any = None,
        callbacks: list | None = None) -> tuple[Any, list[dict]]:
    """Train, then save the model and tokenizer in ``--output-dir``; returns the trainer and the
    record of every episode this run finished, in scoring order (``build_trainer`` says the rest)."""
    trainer, episodes = build_trainer(args, model, tokenizer, callbacks)
    try:
        trainer.train(resume_from_checkpoint=checkpoint_to_resume(args) if args.resume else None)
    finally:
        episodes.close()
    trainer.save_model(args.output_dir)
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"step {entry['step']}: reward {entry['reward']:+.2f} (std {entry['reward_std']:.2f})")
    kept = f"the model and tokenizer, checkpoints and metrics.jsonl in {args.output_dir}"
    print(f"saved {kept}" + (f"; episodes in {args.episodes_out}" if args.episodes_out else ""))
    return trainer, episodes.records


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
