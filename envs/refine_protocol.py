"""The refine protocol: what the refine loop says and how it reads what a model says back.

A model's answer is parsed (``parse_completion``) and its code extracted (``extract_code``: the
language's tag, ``<triton>…</triton>`` for Triton, else the last fenced code block; several files
as ``<file path=…>`` elements); a trusted evaluation becomes a ``TurnResult`` (the seed's
``correctness``, ``speedup``, ``fast_0/1/2``, ``error``, plus what the harness said besides);
``should_stop`` decides whether the sample is done (``success_fast`` or ``max_turns_reached``);
``build_feedback`` words the next user message; ``build_trace`` makes the seed's trace record
(``Turn``, ``Trace``); ``build_messages`` is the opening [system, user] prompt.

KernelRefine-v0 (``refine.py``) and the orchestrator (``kernel_env.workloads.runs.generate``) both use
these, so they cannot disagree on when to stop or what to say. The numbers the text states (trials,
tolerance) come from the evaluation settings, never from constants here.

This module is text in, text out: it never imports the environment, the episode runtime or a
sandbox, and never evaluates anything.
"""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernel_env.evaluators.records import EvalResult, EvalSettings
from kernel_env.evaluators.reward import paid_reward
from kernel_env.languages import Language, get_language
from kernel_env.resources import skill_file
from kernel_env.tasks import Task

MAX_DETAIL_CHARS = 4000
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
    (0.0 unless correct); ``fast_k``: correct and speed-up > k (k = 0, 1, 2). ``reward`` is what
    the evaluation pays (``paid_reward``: the milestone the harness recorded; -1 without one).
    ``atol`` / ``rtol`` are the tolerance the outputs were compared with (the evaluation's
    settings; None when nothing was evaluated). ``fault``: whose fault a failed evaluation is
    (``EvalResult.fault``); an evaluator's fault pays 0, never -1."""

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
    atol: float | None = None
    rtol: float | None = None
    fault: Literal["candidate", "evaluator"] | None = None
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
                   reward=paid_reward(result), runtime_ms=result.runtime_ms, eager_ms=result.eager_ms,
                   compile_ms=result.compile_ms, speedup_vs_compile=result.speedup_vs_compile, atol=result.atol,
                   rtol=result.rtol, fault=result.fault, log_tail=result.log_tail[-1500:])


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


def build_feedback(result: TurnResult | Mapping, tag: str = "triton") -> str:
    """The seed's feedback for one result: the error with its relevant lines; how the output
    mismatched (under the tolerance the result was judged with); ``Correct but slow
    ({speedup:.2f}x PyTorch)`` and a request to optimise; or success."""
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
        # The tolerance is stated only when the result carries it: a number here that the
        # evaluation did not use would mislead the model.
        within = f" (atol={result.atol:g}, rtol={result.rtol:g})" if result.atol is not None and result.rtol is not None else ""
        return f"Incorrect output: mismatch with the PyTorch reference{within}: {how}\n\n{again}"
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


def build_messages(task: Task, language: str | Language = "triton", *, max_turns: int = 1,
                   settings: EvalSettings | None = None) -> list[dict[str, str]]:
    """[system, user] for a task: how answers are judged (``settings``: the trials and tolerance of
    every evaluation, the protocol's defaults when None), the answer format, the skill's rules, and
    the reference code."""
    lang = get_language(language) if isinstance(language, str) else language
    settings = settings or EvalSettings()
    tag = lang.code_tag
    trials = f"{settings.trials} random input set{'s' if settings.trials != 1 else ''}"
    tolerance = (f"atol = rtol = {settings.atol:g}" if settings.atol == settings.rtol
                 else f"atol = {settings.atol:g}, rtol = {settings.rtol:g}")
    system = [
        f"You are an expert GPU kernel engineer. You make PyTorch models faster by rewriting them with your own "
        f"{lang.name} kernels.",
        "The reference is a PyTorch module `Model`, with `get_inputs()` (the forward inputs) and `get_init_inputs()` "
        "(the constructor arguments). Write `ModelNew`: an nn.Module with exactly Model's constructor signature and "
        "parameter names (the evaluator loads Model's state_dict into it), whose forward takes the same inputs and "
        "returns the same outputs, computed by your kernels. Each answer is built and evaluated for you: correctness "
        f"on {trials} ({tolerance}), then its speed against eager PyTorch.",
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
