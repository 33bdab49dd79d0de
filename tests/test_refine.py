"""KernelRefine-v0: the seed orchestrator's refine loop, driven end to end on the CPU by scripted policies.

The seed's relu(x + y) scenario runs in Triton (under the interpreter): x * y is incorrect
without an error, an out-of-bounds access is a runtime error, two launches are correct but slow,
one fused launch is correct. The Triton interpreter cannot beat eager PyTorch on the CPU, so
that episode ends with ``max_turns_reached``, which is what is true here. ``success_fast`` is
shown in C++ on a task where fusion wins by a wide margin (eight chained relu(x + y) steps
in one pass), so load from other processes on a shared machine cannot flip the verdict.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from openai.types.chat import ChatCompletionMessage

import kernel_env
from kernel_env.envs.refine import KernelRefineEnv
from kernel_env.envs.refine_protocol import (
    TurnResult,
    build_feedback,
    build_messages,
    extract_code,
    parse_completion,
    should_stop,
)
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode, TrialReport
from kernel_env.tasks import Task

SETTINGS = EvalSettings(timed_calls=10, warmup_calls=3, job_timeout_s=120, compile_baseline=False)

RELU_ADD = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + y)


    N = 1 << 14


    def get_inputs():
        return [torch.randn(N), torch.randn(N)]


    def get_init_inputs():
        return []
    """
)
TASK = Task(id="test/relu_add_16k", code=RELU_ADD, source="kernelbench", name="relu_add_16k", level=1, problem_id=99)

HEADER = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"

# Turn 1: the wrong operation (x * y): it runs, and its output is wrong.
MULTIPLIES = HEADER + textwrap.dedent(
    """
    @triton.jit
    def vec_op_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x * y, mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x, y):
            out = torch.empty_like(x)
            vec_op_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096)
            return out
    """
)

# Turn 2: no bounds mask and a huge offset: reads and writes far outside the buffers.
OUT_OF_BOUNDS = HEADER + textwrap.dedent(
    """
    @triton.jit
    def bad_access_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + 1000000000
        x = tl.load(x_ptr + offsets)
        y = tl.load(y_ptr + offsets)
        tl.store(out_ptr + offsets, x + y)


    class ModelNew(nn.Module):
        def forward(self, x, y):
            out = torch.empty_like(x)
            bad_access_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096)
            return out
    """
)

# Turn 3: correct, two separate launches, kernels in kernels/add_relu.py (a multi-file answer).
TWO_LAUNCH_KERNELS = HEADER + textwrap.dedent(
    """
    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


    @triton.jit
    def relu_kernel(in_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        v = tl.load(in_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v), mask=mask)
    """
)
TWO_LAUNCH_MODEL = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    import triton

    from kernels.add_relu import add_kernel, relu_kernel


    class ModelNew(nn.Module):
        def forward(self, x, y):
            n = x.numel()
            grid = (triton.cdiv(n, 4096),)
            tmp = torch.empty_like(x)
            add_kernel[grid](x, y, tmp, n, BLOCK=4096)
            out = torch.empty_like(x)
            relu_kernel[grid](tmp, out, n, BLOCK=4096)
            return out
    """
)

# Turn 4: one fused launch.
FUSED = HEADER + textwrap.dedent(
    """
    @triton.jit
    def fused_add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        v = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x, y):
            out = torch.empty_like(x)
            fused_add_relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096)
            return out
    """
)

SCENARIO = [
    {"content": f"<think>\nI will write a kernel for relu(x + y).\n</think>\n\n<triton>\n{MULTIPLIES}</triton>",
     "reasoning_content": "The server's reasoning for turn 1."},
    f"The output was wrong, so let me index memory directly.\n\n<triton>\n{OUT_OF_BOUNDS}</triton>",
    ("The kernel crashed: I need bounds masks. Two kernels for now.\n\n<triton>\n"
     f'<file path="kernels/add_relu.py">\n{TWO_LAUNCH_KERNELS}</file>\n'
     f'<file path="model_new.py">\n{TWO_LAUNCH_MODEL}</file>\n</triton>'),
    f"Correct but slow: fuse the two passes into one.\n\n```python\n{FUSED}```\n",
]


@pytest.fixture(scope="module")
def scenario():
    """The seed's four turns, once: (env after the episode, [(feedback, reward, terminated, truncated, info)], kernel files after turns 3 and 4)."""
    env = KernelRefineEnv(TASK, language="triton", device="cpu", settings=SETTINGS)
    prompt, info = env.reset()
    steps, kernel_files = [], []
    for completion in SCENARIO:
        steps.append(env.step(completion))
        kernel_files.append(sorted(p.name for p in (env.episode.workspace.path / "kernels").glob("*.py")))
    yield env, prompt, info, steps, kernel_files
    env.close()


# ============================================================================ the seed's scenario


def test_turn_1_computing_x_times_y_is_incorrect_without_a_runtime_error(scenario):
    _, _, _, steps, _ = scenario
    feedback, reward, terminated, truncated, info = steps[0]
    result = info["result"]
    assert result["correctness"] is False and result["error"] is None and result["status"] == "incorrect", result
    assert feedback.startswith("Incorrect output: mismatch with the PyTorch reference"), feedback
    assert "elements outside atol=0.01" in feedback and "<triton>...</triton>" in feedback, feedback
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_turn_2_out_of_bounds_access_is_a_runtime_error_shown_to_the_model(scenario):
    _, _, _, steps, _ = scenario
    feedback, reward, terminated, truncated, info = steps[1]
    result = info["result"]
    assert result["correctness"] is False and result["status"] == "error" and result["error"], result
    assert feedback.startswith("Compilation/runtime error:\n" + result["error"].strip().splitlines()[0]), feedback
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_turn_3_two_launches_are_correct_but_slow_and_asked_to_optimise(scenario):
    _, _, _, steps, kernel_files = scenario
    feedback, reward, terminated, truncated, info = steps[2]
    result = info["result"]
    assert result["correctness"] is True and result["fast_0"] is True and 0 < result["speedup"] < 1.0, result
    assert feedback == (f"Correct but slow ({result['speedup']:.2f}x PyTorch). "
                        "Optimize and regenerate the improved code inside <triton>...</triton> tags.")
    assert kernel_files[2] == ["add_relu.py"], "the multi-file answer's kernel module was written to kernels/"
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_turn_4_fused_kernel_is_correct_and_on_the_cpu_the_episode_ends_at_the_turn_limit(scenario):
    env, _, _, steps, kernel_files = scenario
    feedback, reward, terminated, truncated, info = steps[3]
    result = info["result"]
    assert result["correctness"] is True and result["speedup"] < 1.0, "the Triton interpreter cannot be fast"
    assert (terminated, truncated) == (False, True) and info["stop_reason"] == "max_turns_reached"
    assert reward == 1.0 == result["reward"], "the final turn's milestone: correct, not faster than eager"
    assert kernel_files[3] == [], "a single-file answer leaves no stale kernel module behind"
    assert env.step("one more")[0] == "The episode has ended; call reset() to start a new one."


def test_trace_is_in_the_seed_format(scenario):
    env, _, _, steps, _ = scenario
    trace = steps[-1][4]["trace"]
    assert trace == env.trace().model_dump(mode="json") | {"timestamp": trace["timestamp"]}
    seed_keys = {"sample_key", "source", "level", "name", "problem_id", "pytorch_code", "num_turns", "stop_reason",
                 "final_triton_code", "final_result", "turns", "full_messages", "timestamp"}
    assert seed_keys <= trace.keys()
    assert (trace["sample_key"], trace["source"], trace["level"], trace["name"], trace["problem_id"]) == \
           (TASK.id, "kernelbench", 1, "relu_add_16k", 99)
    assert trace["pytorch_code"] == RELU_ADD and trace["num_turns"] == 4 and trace["stop_reason"] == "max_turns_reached"
    assert trace["final_triton_code"].strip() == FUSED.strip()
    assert {"correctness", "speedup", "fast_0", "fast_1", "fast_2", "error"} <= trace["final_result"].keys()
    assert trace["final_result"] == trace["turns"][-1]["result"]
    for number, turn in enumerate(trace["turns"], 1):
        assert {"turn", "thinking", "model_reasoning", "triton_code", "full_completion", "feedback_given", "result"} <= turn.keys()
        assert turn["turn"] == number
    first = trace["turns"][0]
    assert first["thinking"] == "I will write a kernel for relu(x + y)."
    assert first["model_reasoning"] == "The server's reasoning for turn 1."
    assert first["triton_code"].strip() == MULTIPLIES.strip() and first["full_completion"] == SCENARIO[0]["content"]
    assert [t["feedback_given"] is None for t in trace["turns"]] == [False, False, False, True]
    assert [t["result"]["fast_1"] for t in trace["turns"]] == [False, False, False, False]


def test_messages_are_the_conversation_in_openai_format(scenario):
    env, prompt, reset_info, steps, _ = scenario
    assert [m["role"] for m in reset_info["messages"]] == ["system", "user"]
    assert prompt == reset_info["messages"][0]["content"] + "\n\n" + reset_info["messages"][1]["content"]
    assert RELU_ADD.strip() in reset_info["messages"][1]["content"] and "<triton>...</triton>" in prompt
    assert "## Rules" in prompt, "the skill's rules are part of the prompt"
    messages = steps[-1][4]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert [m["content"] for m in messages[3:8:2]] == [s[0] for s in steps[:3]], "each feedback follows its answer"
    assert messages == steps[-1][4]["trace"]["full_messages"]


# ============================================================================ success in C++

CHAIN = RELU_ADD.replace("return torch.relu(x + y)", "for _ in range(8):\n            x = torch.relu(x + y)\n        return x") \
    .replace("N = 1 << 14", "N = 1 << 22")
CHAIN_TASK = Task(id="test/relu_add_chain", code=CHAIN, name="relu_add_chain")
CHAIN_KERNEL = textwrap.dedent(
    """\
    #include <cstdint>

    // Eight chained relu(x + y) steps in one pass over memory, on one thread: on 16 MiB tensors
    // several times faster than eager's sixteen passes, however busy the machine's other core
    // (OpenMP's threads on 4 MiB were not: 0.75x eager once, beside other work on 2 cores).
    void relu_add_chain(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    #pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        const float b = y[i];
        for (int k = 0; k < 8; ++k) {
          v += b;
          v = v < 0.0f ? 0.0f : v;
        }
        out[i] = v;
      }
    }
    """
)
CHAIN_BINDING = textwrap.dedent(
    """\
    #include <torch/types.h>
    #include <torch/csrc/utils/pybind.h>

    #include "../binding_registry.h"

    void relu_add_chain(const float* x, const float* y, float* out, int64_t n);

    static torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
      TORCH_CHECK(x.is_cpu() && x.is_contiguous() && y.is_contiguous() && x.sizes() == y.sizes(), "relu_add_chain: bad inputs");
      torch::Tensor out = torch::empty_like(x);
      relu_add_chain(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
      return out;
    }

    static void register_chain(pybind11::module& m) { m.def("relu_add_chain", &forward); }

    REGISTER_BINDING(relu_add_chain, register_chain);
    """
)
CHAIN_MODEL = textwrap.dedent(
    """\
    import torch.nn as nn

    import cuda_extension


    class ModelNew(nn.Module):
        def forward(self, x, y):
            return cuda_extension.relu_add_chain(x.contiguous(), y.contiguous())
    """
)


def _cpp_answer(kernel: str, extra: str = "") -> str:
    return (f"<cpp>\n<file path=\"kernels/relu_add_chain.cpp\">\n{kernel}</file>\n"
            f"<file path=\"kernels/relu_add_chain_binding.cpp\">\n{CHAIN_BINDING}</file>\n{extra}"
            f"<file path=\"model_new.py\">\n{CHAIN_MODEL}</file>\n</cpp>")


@pytest.mark.slow  # 16 s: a C++ build and a timed evaluation
def test_cpp_build_error_then_fused_kernel_reaches_success_fast():
    env = KernelRefineEnv(CHAIN_TASK, language="cpp", device="cpu", settings=SETTINGS, max_turns=4)
    try:
        prompt, _ = env.reset()
        assert '<file path="kernels/my_op.cpp">' in prompt and "REGISTER_BINDING" in prompt
        broken = CHAIN_KERNEL.replace("out[i] = v;", "out[i] = v")
        feedback, reward, terminated, truncated, info = env.step(
            _cpp_answer(broken, extra='<file path="kernels/scratch.h">\n#pragma once\n</file>\n'))
        assert info["result"]["status"] == "error" and info["result"]["compiled"] is False, info["result"]
        assert info["result"]["fault"] == "candidate" and info["evaluation"]["fault"] == "candidate"  # its own build
        assert feedback.startswith("Compilation/runtime error:") and "kernels/relu_add_chain.cpp:" in feedback, feedback
        assert (reward, terminated, truncated) == (0.0, False, False)

        feedback, reward, terminated, truncated, info = env.step({"content": _cpp_answer(CHAIN_KERNEL)})
        result = info["result"]
        assert result["correctness"] is True and result["speedup"] >= 1.0, (result, info["evaluation"])
        assert feedback == f"Great work! The kernel is correct and fast ({result['speedup']:.2f}x PyTorch)."
        assert (terminated, truncated) == (True, False) and info["stop_reason"] == "success_fast"
        assert reward == result["reward"] == 2.0, "faster than eager by more than 5% (no compile baseline measured)"
        trace = info["trace"]
        assert trace["num_turns"] == 2 and trace["stop_reason"] == "success_fast" and trace["language"] == "cpp"
        assert trace["final_result"]["fast_1"] is True
        kernels = sorted(p.name for p in (env.episode.workspace.path / "kernels").iterdir() if p.is_file())
        assert kernels == ["relu_add_chain.cpp", "relu_add_chain_binding.cpp"], "files the answer dropped are removed"
    finally:
        env.close()


# ============================================================================ malformed actions


@pytest.fixture
def env():
    env = KernelRefineEnv(TASK, language="triton", device="cpu", settings=SETTINGS, max_turns=4)
    env.reset()
    yield env
    env.close()


@pytest.mark.parametrize("action, said", [
    (None, "the action is a NoneType"),
    (42, "the action is a int"),
    (b"\xff\xfe\x00", "binary data"),
    ({"content": None}, "the answer is empty"),
    ({"content": [{"type": "image_url", "image_url": {}}]}, "not text"),
    ("", "the answer is empty"),
    ("<triton>\nimport torch\n", "never closes it with </triton>"),
    ("<think><triton>code</triton></think>Done.", "only inside the <think> block"),
])
def test_junk_is_answered_with_feedback_and_counts_as_a_turn(env, action, said):
    feedback, reward, terminated, truncated, info = env.step(action)
    assert feedback.startswith("Could not use your answer: ") and said in feedback, feedback
    assert "<triton>...</triton>" in feedback
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    assert info["evaluation"] is None and info["result"]["status"] == "bad_answer"


def test_turns_without_code_end_the_episode_at_the_limit_with_reward_minus_one():
    env = KernelRefineEnv(TASK, language="triton", device="cpu", settings=SETTINGS, max_turns=2)
    try:
        env.reset()
        env.step("I am thinking.")
        feedback, reward, terminated, truncated, info = env.step(None)
        assert (reward, terminated, truncated) == (-1.0, False, True)
        assert info["trace"]["stop_reason"] == "max_turns_reached" and info["trace"]["final_triton_code"] is None
    finally:
        env.close()


def test_an_openai_message_object_is_an_action_and_its_reasoning_is_kept(env):
    message = ChatCompletionMessage(role="assistant", content="No code yet.", reasoning_content="hidden plan")
    env.step(message)
    turn = env.trace().turns[0]
    assert (turn.full_completion, turn.model_reasoning, turn.result.status) == ("No code yet.", "hidden plan", "bad_answer")


def test_a_file_outside_the_agents_files_is_refused_and_nothing_is_written(env):
    answer = '<triton>\n<file path="model.py">\nimport os\n</file>\n<file path="model_new.py">\nx = 1\n</file>\n</triton>'
    feedback, *_ = env.step(answer)
    assert "'model.py' is not a file you may write" in feedback, feedback
    assert "x = 1" not in (env.episode.workspace.path / "model_new.py").read_text()


def test_async_reset_and_step_run_the_same_episode():
    env = KernelRefineEnv(TASK, language="triton", device="cpu", settings=SETTINGS, max_turns=1)

    async def episode():
        _, info = await env.areset()
        return info, await env.astep("nothing")

    try:
        info, (feedback, reward, terminated, truncated, step_info) = asyncio.run(episode())
        assert info["turn"] == 0 and step_info["turn"] == 1 and truncated and reward == -1.0
    finally:
        env.close()


def test_registered_with_gymnasium_and_check_env_clean():
    env = gymnasium.make("kernel_env/KernelRefine-v0", task=TASK, language="triton", device="cpu", settings=SETTINGS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the checker warns about what it finds: none is acceptable
            check_env(env.unwrapped, skip_render_check=True)
            env.reset(seed=1)  # through gymnasium's wrappers, the passive checker included
            feedback, *_ = env.step(env.action_space.sample())
        assert feedback.startswith("Could not use your answer")
        assert isinstance(kernel_env.make("KernelRefine-v0", task=TASK, device="cpu"), KernelRefineEnv)
    finally:
        env.close()


# ============================================================================ extraction, stopping, feedback


@pytest.mark.parametrize("content, language, files", [
    ("Plan.\n<triton>\nA = 1\n</triton>", "triton", {"model_new.py": "A = 1\n"}),
    ("<triton>A = 1</triton> then, better: <triton>A = 2</triton>", "triton", {"model_new.py": "A = 2\n"}),
    ("<triton>\n```python\nA = 3\n```\n</triton>", "triton", {"model_new.py": "A = 3\n"}),
    ("```python\nA = 4\n```\nand finally\n```\nA = 5\n```", "triton", {"model_new.py": "A = 5\n"}),
    ("<think>draft <triton>A = 0</triton></think><triton>A = 6</triton>", "triton", {"model_new.py": "A = 6\n"}),
    ('<cpp><file path="kernels/k.cpp">int k;</file><file path="./model_new.py">A = 7</file></cpp>', "cpp",
     {"kernels/k.cpp": "int k;\n", "model_new.py": "A = 7\n"}),
    ('<cuda><file path="kernels/k.cu">__global__ void k() {}</file><file path="model_new.py">A = 8</file></cuda>', "cuda",
     {"kernels/k.cu": "__global__ void k() {}\n", "model_new.py": "A = 8\n"}),
])
def test_code_is_extracted_from_the_tag_or_the_last_fenced_block(content, language, files):
    extracted = extract_code(content, language)
    assert extracted.problem is None and extracted.files == files


@pytest.mark.parametrize("content, language, problem", [
    ("No code at all.", "triton", "no <triton>...</triton> block and no fenced code block"),
    ("<triton>A = 1</triton>", "cpp", "no <cpp>...</cpp> block"),
    ("<cpp>int k;</cpp>", "cpp", 'put each in a <file path="...">...</file> element'),
    ('<cpp><file path="kernels/k.cpp">int k;</file></cpp>', "cpp", 'no <file path="model_new.py"> element'),
    ('<cpp><file path="kernels/k.py">A</file><file path="model_new.py">A</file></cpp>', "cpp", "'kernels/k.py' is not a file you may write"),
    ('<triton><file path="kernels/../model.py">A</file></triton>', "triton", "is not a file you may write"),
    ('<triton><file path="model_new.py">A</file><file path="model_new.py">B</file></triton>', "triton", "appears twice"),
    ("<triton>  </triton>", "triton", "block is empty"),
])
def test_answers_without_usable_code_say_why(content, language, problem):
    extracted = extract_code(content, language)
    assert extracted.files is None and problem in extracted.problem, extracted.problem


def test_success_on_the_last_turn_is_success_fast():
    fast = TurnResult(correctness=True, speedup=1.3, status="fast")
    slow = TurnResult(correctness=True, speedup=0.84, status="slow")
    assert should_stop(4, 4, fast) == (True, "success_fast")
    assert should_stop(4, 4, slow) == (True, "max_turns_reached")
    assert should_stop(2, 4, slow.model_dump()) == (False, "continue")
    assert build_feedback(slow) == ("Correct but slow (0.84x PyTorch). Optimize and regenerate the improved code inside "
                                    "<triton>...</triton> tags.")


def test_a_crash_is_explained_in_the_feedback():
    crashed = TurnResult(status="error", compiled=True, error="the worker process died during Serve (exit code 139)")
    assert "SIGSEGV" in build_feedback(crashed, "cuda") and "<cuda>...</cuda>" in build_feedback(crashed, "cuda")


def test_completions_are_read_from_every_shape_a_client_produces():
    assert parse_completion({"content": "a", "reasoning": "r"}) == parse_completion(
        ChatCompletionMessage(role="assistant", content="a", reasoning_content="r"))
    assert parse_completion({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}).content == "ab"


def test_the_prompt_of_each_language_names_its_tag_and_rules():
    for language in ("triton", "cpp", "cuda"):
        system, user = build_messages(TASK, language, max_turns=4)
        assert f"<{language}>...</{language}>" in system["content"] and "## Rules" in system["content"]
        assert "up to 4 attempts" in system["content"] and TASK.code.strip() in user["content"]
    assert "attempts" not in build_messages(TASK, "triton", max_turns=1)[0]["content"]


def test_the_prompt_and_the_feedback_state_the_tolerance_the_evaluation_uses():
    strict = EvalSettings(trials=3, atol=1e-3, rtol=1e-4)
    system = build_messages(TASK, "triton", settings=strict)[0]["content"]
    assert "correctness on 3 random input sets (atol = 0.001, rtol = 0.0001)" in system, system
    assert "on 5 random input sets (atol = rtol = 0.01)" in build_messages(TASK, "triton")[0]["content"]
    judged = EvalResult(job_id="j", task_id=TASK.id, language="triton", device="cpu", mode=Mode.PROFILE, correct=False,
                        trials=[TrialReport(trial=0, correct=False, message="3 elements differ")], reward=-1.0,
                        atol=strict.atol, rtol=strict.rtol)
    feedback = build_feedback(TurnResult.from_eval(judged))
    assert feedback.startswith("Incorrect output: mismatch with the PyTorch reference (atol=0.001, rtol=0.0001): "
                               "trial 1: 3 elements differ"), feedback


def test_the_refine_protocol_imports_nothing_of_the_environment():
    probe = ("import sys, kernel_env.envs.refine_protocol; "
             "print(sorted(m for m in ('kernel_env.envs.refine', 'kernel_env.envs.common', 'kernel_env.runtime.episode', "
             "'kernel_env.sandbox') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing the refine protocol loaded {loaded}"
