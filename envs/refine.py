"""KernelRefine-v0: the fixed multi-turn refine loop of the seed orchestrator, as a Gymnasium env.

::

    env = kernel_env.make("KernelRefine-v0", task="example/relu_add", language="triton", device="cpu")
    prompt, info = env.reset()                  # info["messages"]: [system, user] (OpenAI chat format)
    feedback, reward, terminated, truncated, info = env.step(completion)

An action is one model completion: a str, a dict with ``content`` (and optionally
``reasoning_content``), or an OpenAI ``ChatCompletionMessage`` (or ``ChatCompletion``). The env
extracts the code (the language's tag, ``<triton>…</triton>`` for Triton, else the last fenced
code block), writes it into the episode's workspace (model_new.py, or every ``<file path=…>``
element), builds it in the sandbox and evaluates it through the pool exactly as an agent's
``python3 -m utils.profiling`` would, and answers with the seed's feedback: the error, how the
output mismatched, ``{speedup:.2f}x PyTorch`` (speed-up over eager PyTorch) with a request to
optimise, or success. Nothing a model sends makes ``step`` raise: an answer without usable code
is told so, and counts as a turn.

The episode stops on ``success_fast`` (correct and speed-up ≥ 1.0: terminated) or
``max_turns_reached`` (truncated). Reward is 0 on every other step and the final turn's milestone
reward (CUDA Agent eq. 1: -1, 1, 2, 3) on the last. The last step's ``info["trace"]`` (and
``trace()``) is the seed orchestrator's trace record, ready for SFT.

The pure pieces (``parse_completion``, ``extract_code``, ``should_stop``, ``build_feedback``,
``build_trace``) are shared with ``kernel_env.generate``, so the env and the orchestrator cannot
disagree on when to stop or what to say.
"""

from __future__ import annotations

import datetime
import fnmatch
import functools
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium
from pydantic import BaseModel, Field

from kernel_env.envs.common import ModelOutputSpace, TextSpace, in_thread
from kernel_env.episode import Episode, default_device
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode
from kernel_env.evaluators.report import model_report
from kernel_env.languages import Language, get_language
from kernel_env.pool import GpuPool, shared_pool
from kernel_env.resources import skill_file
from kernel_env.sandbox import SandboxError
from kernel_env.tasks import Task, resolve_task

MAX_OBSERVATION_CHARS = 1_000_000
MAX_DETAIL_CHARS = 4000
_ENDED = "The episode has ended; call reset() to start a new one."
MODEL_NEW = "model_new.py"

StopReason = Literal["success_fast", "max_turns_reached"]
#: What one answer came to: unusable (no code), did not build or run, broke a rule, wrong, slow, fast.
Status = Literal["bad_answer", "error", "violation", "incorrect", "slow", "fast"]


# ============================================================================ completions and code


@dataclass(frozen=True)
class Completion:
    """What a model said: the answer text, the server's reasoning (``reasoning_content``), and
    ``problem`` when the action was not a completion at all (None, a number, binary junk)."""

    content: str
    reasoning: str | None = None
    problem: str | None = None


def parse_completion(action: Any) -> Completion:
    """The completion in ``action``; never raises.

    Accepts a str (or UTF-8 bytes), a mapping with ``content`` and optional ``reasoning_content``
    (or ``reasoning``, newer vLLM), an object with those attributes (OpenAI's
    ``ChatCompletionMessage``), or a ``ChatCompletion`` (its first choice's message). ``content``
    may also be a list of OpenAI content parts (``{"type": "text", "text": ...}``)."""
    if isinstance(action, (bytes, bytearray, memoryview)):
        try:
            return Completion(bytes(action).decode("utf-8"))
        except UnicodeDecodeError:
            return Completion("", problem=f"the answer is binary data ({len(action)} bytes), not UTF-8 text")
    if isinstance(action, str):
        return Completion(action)
    choices = _field(action, "choices")
    if isinstance(choices, (list, tuple)) and choices:
        return parse_completion(_field(choices[0], "message"))
    if isinstance(action, Mapping) or hasattr(action, "content"):
        content = _text(_field(action, "content"))
        reasoning = _text(_field(action, "reasoning_content")) or _text(_field(action, "reasoning")) or None
        if content is None:
            kind = type(_field(action, "content")).__name__
            return Completion("", reasoning, problem=f"the answer's content is a {kind}, not text")
        return Completion(content, reasoning)
    return Completion("", problem=f"the action is a {type(action).__name__}, not a model completion "
                                  "(a str, or a message with content)")


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:  # pydantic models from the openai package keep unknown fields in model_extra
        extra = getattr(obj, "model_extra", None)
        value = extra.get(name) if isinstance(extra, Mapping) else None
    return value


def _text(value: Any) -> str | None:
    """Text of a content value: a str, None (empty), or a list of content parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        parts = [_field(part, "text") if not isinstance(part, str) else part for part in value]
        if all(isinstance(part, str) for part in parts):
            return "".join(parts)
    return None


@dataclass(frozen=True)
class Extracted:
    """The code of one answer. ``files`` maps workspace paths to contents; it is None, and
    ``problem`` says why, when the answer holds no usable code. ``code`` is the text that was
    extracted (the trace's ``triton_code``); ``thinking`` the answer's own ``<think>`` block."""

    code: str | None
    files: dict[str, str] | None
    problem: str | None = None
    thinking: str | None = None


_FENCED = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_FILE = re.compile(r"<file\s+path\s*=\s*([\"'])(.*?)\1\s*>(.*?)</file\s*>", re.DOTALL)
_WHOLE_FENCE = re.compile(r"\A\s*```[^\n`]*\n(.*?)\n?```\s*\Z", re.DOTALL)


def split_thinking(content: str) -> tuple[str | None, str]:
    """(thinking, answer): a ``<think>…</think>`` block (or everything before a lone ``</think>``,
    as vLLM leaves it without a reasoning parser) is thinking, not answer."""
    if "</think>" not in content:
        return None, content
    before, _, after = content.rpartition("</think>")
    thinking = before.split("<think>", 1)[-1].strip()
    return thinking or None, after


def extract_code(content: str, language: str | Language = "triton") -> Extracted:
    """The code in an answer; never raises.

    Where: the last ``<tag>…</tag>`` block of the language's tag (``<triton>``, ``<cpp>``,
    ``<cuda>``) outside any ``<think>`` block, else the last fenced code block. What: every
    ``<file path="…">…</file>`` element inside it (paths: model_new.py and the language's kernel
    files, such as kernels/*.cu), or, without file elements, the whole block as model_new.py.
    Languages that build an extension (cuda, cpp) need file elements, since their kernels live
    in kernels/."""
    lang = get_language(language) if isinstance(language, str) else language
    thinking, answer = split_thinking(content)
    tag = lang.code_tag
    if not answer.strip():
        only_thinking = " (there is only a <think> block)" if thinking else ""
        return Extracted(None, None, f"the answer is empty{only_thinking}", thinking)
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", answer, re.DOTALL)
    if blocks:
        code = blocks[-1]
    elif f"<{tag}>" in answer:
        return Extracted(None, None, f"the answer opens <{tag}> but never closes it with </{tag}> (was it cut off?)",
                         thinking)
    else:
        fenced = _FENCED.findall(answer)
        if not fenced:
            hidden = thinking is not None and (f"<{tag}>" in thinking or "```" in thinking)
            where = " (only inside the <think> block)" if hidden else ""
            return Extracted(None, None, f"the answer has no <{tag}>...</{tag}> block and no fenced code block{where}",
                             thinking)
        code = fenced[-1]
    code = code.strip("\n")
    files, problem = _files_of(code, lang)
    return Extracted(code if code.strip() else None, files, problem, thinking)


def _files_of(code: str, lang: Language) -> tuple[dict[str, str] | None, str | None]:
    elements = _FILE.findall(code)
    if not elements:
        if not code.strip():
            return None, f"the <{lang.code_tag}> block is empty"
        if lang.builds_extension:
            return None, (f"a {lang.name} answer holds several files: put each in a <file path=\"...\">...</file> "
                          f"element inside the <{lang.code_tag}> block (model_new.py and {', '.join(lang.kernel_globs)})")
        return {MODEL_NEW: _source(code)}, None
    files: dict[str, str] = {}
    for _, raw_path, text in elements:
        path = raw_path.strip().removeprefix("./")
        problem = _path_problem(path, lang)
        if problem:
            return None, problem
        if path in files:
            return None, f"{path} appears twice in the answer; give each file once"
        files[path] = _source(text)
    if MODEL_NEW not in files:
        return None, f"the answer has no <file path=\"{MODEL_NEW}\"> element; ModelNew lives in {MODEL_NEW}"
    return files, None


def _path_problem(path: str, lang: Language) -> str | None:
    if path == MODEL_NEW:
        return None
    parts = path.split("/")
    for pattern in lang.kernel_globs:
        pattern_parts = pattern.split("/")
        if len(parts) == len(pattern_parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern_parts)) \
                and ".." not in parts:
            return None
    return f"{path!r} is not a file you may write: give {MODEL_NEW} and files matching {', '.join(lang.kernel_globs)}"


def _source(text: str) -> str:
    """A file's contents as written in the answer: a fence around the whole of it removed, one trailing newline."""
    fenced = _WHOLE_FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    return text.strip("\n") + "\n"


# ============================================================================ results and feedback


class TurnResult(BaseModel):
    """The evaluation of one answer, in the seed's shape (``correctness``, ``speedup``, ``fast_0/1/2``,
    ``error``) plus what the trusted harness says besides. ``speedup`` is over eager PyTorch
    (0.0 unless correct); ``fast_k``: correct and speed-up > k (k = 0, 1, 2)."""

    correctness: bool = False
    speedup: float = 0.0
    fast_0: bool = False
    fast_1: bool = False
    fast_2: bool = False
    error: str | None = None
    status: Status = "bad_answer"
    compiled: bool = False
    mismatch: str | None = None
    violations: list[str] = Field(default_factory=list)
    reward: float = -1.0
    runtime_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_compile: float | None = None
    log_tail: str = ""

    @classmethod
    def bad_answer(cls, why: str) -> TurnResult:
        return cls(status="bad_answer", error=why)

    @classmethod
    def from_eval(cls, result: EvalResult) -> TurnResult:
        correct = bool(result.correct and not result.error and not result.violations)
        speedup = (result.speedup_vs_eager or 0.0) if correct else 0.0
        failed = [t for t in result.trials if not t.correct and t.message]
        mismatch = "; ".join(f"trial {t.trial + 1}: {t.message}" for t in failed[:2]) or None
        if not result.compiled or (result.error and not result.violations):
            status: Status = "error"
        elif result.violations:
            status = "violation"
        elif not correct:
            status = "incorrect"
        else:
            status = "fast" if speedup >= 1.0 else "slow"
        return cls(correctness=correct, speedup=speedup, fast_0=correct and speedup > 0, fast_1=correct and speedup > 1,
                   fast_2=correct and speedup > 2, error=result.error, status=status, compiled=result.compiled,
                   mismatch=mismatch if not correct else None, violations=list(result.violations),
                   reward=result.reward if result.reward is not None else -1.0, runtime_ms=result.runtime_ms,
                   eager_ms=result.eager_ms, compile_ms=result.compile_ms, speedup_vs_compile=result.speedup_vs_compile,
                   log_tail=result.log_tail[-1500:])


def should_stop(turn: int, max_turns: int, result: TurnResult | Mapping) -> tuple[bool, StopReason | Literal["continue"]]:
    """(stop, reason) after ``turn`` (1-based): correct and speed-up ≥ 1.0 is ``success_fast``
    (checked first, so a success on the last turn counts as one); otherwise ``turn >= max_turns``
    is ``max_turns_reached``; else ``continue``."""
    result = _as_result(result)
    if result.correctness and result.speedup >= 1.0:
        return True, "success_fast"
    if turn >= max_turns:
        return True, "max_turns_reached"
    return False, "continue"


#: Signals a crashed candidate process dies of (exit code 128 + n, or -n from Python), and what they usually mean.
_SIGNALS = {6: "SIGABRT: an abort, such as a failed assertion or check",
            9: "SIGKILL: usually the process ran out of memory",
            11: "SIGSEGV: a segmentation fault, usually an out-of-bounds memory access"}


def build_feedback(result: TurnResult | Mapping, tag: str = "triton", *, atol: float = 1e-2, rtol: float = 1e-2) -> str:
    """The seed's feedback for one result: the error with its relevant lines; how the output
    mismatched; ``Correct but slow ({speedup:.2f}x PyTorch)`` and a request to optimise; or success."""
    result = _as_result(result)
    again = f"Fix and regenerate the corrected code inside <{tag}>...</{tag}> tags."
    if result.status == "bad_answer":
        return f"Could not use your answer: {result.error}.\n\nGive the complete code inside <{tag}>...</{tag}> tags."
    if result.status == "error":
        return f"Compilation/runtime error:\n{_error_details(result)}\n\n{again}"
    if result.status == "violation":
        rules = "\n".join(f"- {v}" for v in result.violations)
        return f"Rule violation: the code was rejected, whatever its output:\n{rules}\n\n{again}"
    if result.status == "incorrect":
        how = result.mismatch or "the outputs differ"
        return f"Incorrect output: mismatch with the PyTorch reference (atol={atol:g}, rtol={rtol:g}): {how}\n\n{again}"
    if result.status == "slow":
        return (f"Correct but slow ({result.speedup:.2f}x PyTorch). "
                f"Optimize and regenerate the improved code inside <{tag}>...</{tag}> tags.")
    return f"Great work! The kernel is correct and fast ({result.speedup:.2f}x PyTorch)."


def _error_details(result: TurnResult) -> str:
    text = (result.error or "unknown error").strip()
    if result.log_tail and result.log_tail.strip() not in text:
        text += "\n-- output of the candidate process (tail) --\n" + result.log_tail.strip()
    if len(text) > MAX_DETAIL_CHARS:
        text = text[:MAX_DETAIL_CHARS] + "\n[… cut]"
    code = re.search(r"exit code (-?\d+)", text)
    if code:
        number = int(code.group(1))
        signal = number - 128 if number > 128 else -number
        if signal in _SIGNALS:
            text += f"\n(exit code {number} is {_SIGNALS[signal]})"
    return text


def _as_result(result: TurnResult | Mapping) -> TurnResult:
    return result if isinstance(result, TurnResult) else TurnResult.model_validate(dict(result))


# ============================================================================ the trace


class Turn(BaseModel):
    """One turn of the trace. ``thinking``: the answer's own ``<think>`` block; ``model_reasoning``:
    the server's ``reasoning_content``; ``triton_code``: the extracted code (whatever the
    language); ``feedback_given``: None on the last turn."""

    turn: int
    thinking: str | None = None
    model_reasoning: str | None = None
    triton_code: str | None = None
    full_completion: str
    feedback_given: str | None = None
    result: TurnResult


class Trace(BaseModel):
    """The seed orchestrator's trace of one sample, plus ``task_id`` and ``language``.

    ``full_messages`` is the conversation in OpenAI chat format: system, user, then each
    answer and its feedback, ending with the final answer."""

    sample_key: str
    source: str | None = None
    level: int | str | None = None
    name: str | None = None
    problem_id: int | str | None = None
    pytorch_code: str
    num_turns: int
    stop_reason: str | None = None
    final_triton_code: str | None = None
    final_result: TurnResult | None = None
    turns: list[Turn] = Field(default_factory=list)
    full_messages: list[dict[str, Any]] = Field(default_factory=list)
    timestamp: str
    task_id: str | None = None
    language: str | None = None


def build_trace(*, sample_key: str, sample: Mapping[str, Any], pytorch_code: str, turns: list[Turn | Mapping],
                messages: list[dict[str, Any]], stop_reason: str | None, language: str | None = None) -> Trace:
    """The trace record of a (finished) sample: ``sample`` gives source, level, name, problem_id, task_id."""
    turns = [t if isinstance(t, Turn) else Turn.model_validate(dict(t)) for t in turns]
    last = turns[-1] if turns else None
    return Trace(sample_key=sample_key, source=sample.get("source"), level=sample.get("level"), name=sample.get("name"),
                 problem_id=sample.get("problem_id"), pytorch_code=pytorch_code, num_turns=len(turns),
                 stop_reason=stop_reason, final_triton_code=last.triton_code if last else None,
                 final_result=last.result if last else None, turns=turns, full_messages=[dict(m) for m in messages],
                 timestamp=datetime.datetime.now().isoformat(), task_id=sample.get("task_id"), language=language)


def sample_of(task: Task) -> dict[str, Any]:
    """A task's fields as the seed's ``sample`` record."""
    return {"source": task.source, "level": task.level, "name": task.name, "problem_id": task.problem_id, "task_id": task.id}


# ============================================================================ the prompt


def build_messages(task: Task, language: str | Language = "triton", *, max_turns: int = 1) -> list[dict[str, str]]:
    """[system, user] for a task: the answer format, the skill's rules, and the reference code."""
    lang = get_language(language) if isinstance(language, str) else language
    tag = lang.code_tag
    system = [
        f"You are an expert GPU kernel engineer. You make PyTorch models faster by rewriting them with your own "
        f"{lang.name} kernels.",
        "The reference is a PyTorch module `Model`, with `get_inputs()` (the forward inputs) and `get_init_inputs()` "
        "(the constructor arguments). Write `ModelNew`: an nn.Module with exactly Model's constructor signature and "
        "parameter names (the evaluator loads Model's state_dict into it), whose forward takes the same inputs and "
        "returns the same outputs, computed by your kernels. Each answer is built and evaluated for you: correctness "
        "on 5 random input sets (atol = rtol = 1e-2), then its speed against eager PyTorch.",
        "## How to answer\n\n" + _answer_format(lang),
        _rules(lang),
    ]
    if max_turns > 1:
        system.append(f"## Feedback\n\nYou have up to {max_turns} attempts. After an answer you may get feedback: a "
                      f"compilation or runtime error, an output mismatch, or the speed-up over PyTorch. Then analyse "
                      f"it and answer again with the complete, improved code inside <{tag}>...</{tag}> tags.")
    user = (f"Write ModelNew for this PyTorch reference (model.py of task {task.id}):\n\n"
            f"```python\n{task.code.rstrip()}\n```\n\n"
            f"Reason about the design first, then give the complete code inside <{tag}>...</{tag}> tags.")
    return [{"role": "system", "content": "\n\n".join(system)}, {"role": "user", "content": user}]


def _answer_format(lang: Language) -> str:
    tag, globs = lang.code_tag, ", ".join(lang.kernel_globs)
    if not lang.builds_extension:
        return (f"Give the complete contents of {MODEL_NEW} (imports, your kernels, class ModelNew) inside "
                f"<{tag}>...</{tag}> tags. To split the code over several files, put each file in a "
                f"<file path=\"...\">...</file> element inside the tags instead: {MODEL_NEW} and {globs}.")
    kernel = lang.kernel_globs[0].replace("*", "my_op")
    return (f"Give every file of your solution inside <{tag}>...</{tag}> tags, each in a <file path=\"...\">...</file> "
            f"element: {MODEL_NEW} and your kernel files ({globs}). For example:\n\n"
            f"<{tag}>\n<file path=\"{kernel}\">\n...\n</file>\n<file path=\"kernels/my_op_binding.cpp\">\n...\n</file>\n"
            f"<file path=\"{MODEL_NEW}\">\n...\n</file>\n</{tag}>\n\n"
            "The files are built into one Python module, `cuda_extension`, with the workspace's binding.cpp. A "
            "kernels/<op>_binding.cpp file holds the torch wrapper of a kernel: it includes <torch/types.h>, "
            "<torch/csrc/utils/pybind.h> and \"../binding_registry.h\", checks its inputs with TORCH_CHECK, allocates "
            "outputs with torch::empty / torch::empty_like, and registers itself with "
            "REGISTER_BINDING(name, register_fn), where register_fn(pybind11::module& m) calls m.def(...). "
            f"{MODEL_NEW} does `import cuda_extension` and calls those functions in ModelNew.forward.")


def _rules(lang: Language) -> str:
    """The "Rules" section of the language's SKILL.md, as the model in the refine loop must follow them too."""
    text = skill_file(lang.name).read_text()
    match = re.search(r"^## Rules[^\n]*\n.*?(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    if match is None:
        raise ValueError(f"{skill_file(lang.name)} has no '## Rules' section; the refine prompt quotes it")
    return match.group(0).strip()


# ============================================================================ the environment


class CompletionSpace(ModelOutputSpace):
    """Model completions: a str, a message mapping, or an OpenAI message object.

    ``sample()`` gives a completion without code: stepping it is cheap (no build, no evaluation)
    and is answered with feedback saying so, which is what checkers and smoke tests need."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, (str, bytes, Mapping)) or hasattr(x, "content") or hasattr(x, "choices")

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return "I will think about the kernel design before writing any code."

class KernelRefineEnv(gymnasium.Env):
    """See the module docstring. Keyword arguments:

    task        a Task, or a spec for ``resolve_task`` ("example/relu_add", a .py file, ...);
                ``reset(options={"task": ...})`` switches task
    language    cuda | cpp | triton (default triton); its tag is the answer's tag
    device      where the trusted harness runs: cuda | cpu (default: cuda where a GPU is visible)
    sandbox     sandbox backend ("local")
    pool        a GpuPool, or a pool kind ("local", "ray") for this process's shared pool of that kind;
                default: the shared local pool
    max_turns   answers before the episode is truncated (default 4, the seed's)
    settings    EvalSettings for every evaluation
    """

    metadata = {"render_modes": []}

    def __init__(self, task: Task | str | None = None, *, language: str = "triton", device: str | None = None,
                 sandbox: str = "local", pool: GpuPool | str | None = None, max_turns: int = 4,
                 settings: EvalSettings | None = None, kernelbench_root: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.lang = get_language(language)
        self.kernelbench_root = kernelbench_root
        self.task = self._task(task) if task is not None else None
        self.device = device or default_device()
        self.sandbox_kind = sandbox
        self.pool = shared_pool(pool) if isinstance(pool, str) else pool
        self.max_turns = max_turns
        self.settings = settings or EvalSettings()
        self.observation_space = TextSpace(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.action_space = CompletionSpace()
        self.episode: Episode | None = None
        self._reset_state()

    @property
    def language(self) -> str:
        return self.lang.name

    def _task(self, task: Task | str) -> Task:
        return task if isinstance(task, Task) else resolve_task(task, kernelbench_root=self.kernelbench_root)

    def _reset_state(self) -> None:
        self.turn = 0
        self.done = False
        self.stop_reason: StopReason | None = None
        self.turns: list[Turn] = []
        self.messages: list[dict[str, Any]] = []
        self.evaluations: list[EvalResult] = []

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Close the previous episode, open a fresh workspace and sandbox, return the prompt
        (system and user text); ``info["messages"]`` holds them as chat messages."""
        super().reset(seed=seed)
        if options and options.get("task") is not None:
            self.task = self._task(options["task"])
        if self.task is None:
            raise ValueError("no task: pass task=... to KernelRefineEnv or reset(options={'task': ...})")
        self._close_episode()
        self._reset_state()
        self.episode = Episode.open(self.task, language=self.language, device=self.device, sandbox=self.sandbox_kind,
                                    pool=self.pool, settings=self.settings)
        self.messages = build_messages(self.task, self.lang, max_turns=self.max_turns)
        observation = "\n\n".join(m["content"] for m in self.messages)
        info = {"task_id": self.task.id, "language": self.language, "device": self.device, "max_turns": self.max_turns,
                "turn": 0, "messages": self._messages(), "workspace_host_path": str(self.episode.workspace.path)}
        return observation, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Evaluate one completion and answer with feedback; never raises for anything a model sends."""
        if self.done or self.episode is None:
            return _ENDED, 0.0, self.stop_reason == "success_fast", self.stop_reason == "max_turns_reached", \
                {"turn": self.turn, "max_turns": self.max_turns, "messages": self._messages()}
        self.turn += 1
        completion = parse_completion(action)
        extracted = extract_code(completion.content, self.lang) if completion.problem is None else \
            Extracted(None, None, completion.problem)
        evaluation = None
        if extracted.files is None:
            result = TurnResult.bad_answer(extracted.problem or "no code found")
        else:
            result, evaluation = self._evaluate(extracted.files)
        stop, reason = should_stop(self.turn, self.max_turns, result)
        feedback = build_feedback(result, self.lang.code_tag, atol=self.settings.atol, rtol=self.settings.rtol)
        self.turns.append(Turn(turn=self.turn, thinking=extracted.thinking, model_reasoning=completion.reasoning,
                               triton_code=extracted.code, full_completion=completion.content,
                               feedback_given=None if stop else feedback, result=result))
        self.messages.append({"role": "assistant", "content": completion.content})
        if not stop:
            self.messages.append({"role": "user", "content": feedback})
        info: dict[str, Any] = {
            "turn": self.turn, "max_turns": self.max_turns, "messages": self._messages(),
            "result": result.model_dump(mode="json"), "turn_record": self.turns[-1].model_dump(mode="json"),
            "evaluation": evaluation.summary() if evaluation is not None else None,
            "report": model_report(evaluation) if evaluation is not None else None,
            "stop_reason": reason if stop else None,
        }
        reward = 0.0
        if stop:
            self.done, self.stop_reason = True, reason
            reward = result.reward
            info["trace"] = self.trace().model_dump(mode="json")
        return feedback, reward, stop and reason == "success_fast", stop and reason == "max_turns_reached", info

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return await in_thread(functools.partial(self.reset, seed=seed, options=options))

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return await in_thread(functools.partial(self.step, action))

    def close(self) -> None:
        self._close_episode()

    def trace(self) -> Trace:
        """The episode's trace so far (``stop_reason`` is None while it runs)."""
        if self.task is None:
            raise ValueError("no task: the environment has not been reset")
        return build_trace(sample_key=self.task.id, sample=sample_of(self.task), pytorch_code=self.task.code,
                           turns=self.turns, messages=self.messages, stop_reason=self.stop_reason, language=self.language)

    # ------------------------------------------------------------------ one answer

    def _evaluate(self, files: dict[str, str]) -> tuple[TurnResult, EvalResult | None]:
        """Make the agent's files exactly ``files``, build and profile them as utils.profiling would."""
        try:
            self._sync_files(files)
            _, evaluation = self.episode.build_and_evaluate(Mode.PROFILE)
        except SandboxError as exc:
            return TurnResult(status="error", error=f"the sandbox could not take the code: {exc}"), None
        self.evaluations.append(evaluation)
        return TurnResult.from_eval(evaluation), evaluation

    def _sync_files(self, files: dict[str, str]) -> None:
        """Remove agent files the answer does not hold and write those that changed. Unchanged files
        keep their modification times, so an incremental build recompiles only what changed."""
        box = self.episode.sandbox
        workdir = box.workdir.rstrip("/") + "/"
        present = {info.path.removeprefix(workdir) for info in box.glob("kernels/**") if not info.is_dir}
        if box.stat(MODEL_NEW) is not None:
            present.add(MODEL_NEW)
        stale = sorted(present - files.keys())
        if stale:
            box.exec("rm -f -- " + " ".join(shlex.quote(path) for path in stale), timeout=60)
        for path, text in files.items():
            data = text.encode()
            if path in present and box.read_bytes(path) == data:
                continue
            box.write_bytes(path, data)

    def _messages(self) -> list[dict[str, Any]]:
        return [dict(message) for message in self.messages]

    def _close_episode(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None
