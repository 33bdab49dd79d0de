"""Renderers of an EvalResult: the text a model reads, and a table a person reads."""

from __future__ import annotations

from kernel_env.evaluators.records import EvalResult, Mode


def _ms(value: float | None) -> str:
    return "n/a" if value is None else (f"{value * 1e3:.1f} us" if value < 1 else f"{value:.3f} ms")


def speedup_text(value: float | None) -> str:
    """A speed-up as people read it: two decimals, two significant digits below 0.1x (0.0021x, not 0.00x)."""
    return "n/a" if value is None else f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _tolerance(result: EvalResult) -> str:
    if result.atol == result.rtol:
        return f"atol=rtol={result.atol:g}"
    return f"atol={result.atol:g}, rtol={result.rtol:g}"


def milestone_text(result: EvalResult) -> str:
    if result.fault == "evaluator":
        return "not decided: the evaluation failed by the evaluator's fault (no reward)"
    if not result.correct:
        return "not reached: the candidate is not correct (reward -1)"
    if result.runtime is None:
        return "correct (reward 1 once timed; run `python3 -m utils.profiling` for speed)"
    reward, margin = result.reward, f"{result.speedup_margin:.0%}"
    return {
        3.0: f"faster than both eager and torch.compile by more than {margin} (reward 3: the goal)",
        2.0: f"faster than eager by more than {margin}, not yet than torch.compile (reward 2)",
        1.0: f"correct, but not more than {margin} faster than eager (reward 1)",
    }.get(reward, f"reward {reward}")


def model_report(result: EvalResult) -> str:
    """What the agent sees after `python3 -m utils.verification` / `utils.profiling`."""
    title = {Mode.VERIFY: "VERIFICATION", Mode.PROFILE: "PROFILING", Mode.FINAL: "FINAL EVALUATION"}[result.mode]
    lines = [f"== {title}: {result.task_id} ({result.language}, {result.device_name or result.device}) =="]
    if result.fault == "evaluator":
        lines.append("EVALUATOR FAULT: the evaluation itself failed, not your code; no reward is decided by it. "
                     "Run it again; if it keeps failing, the machine or the task is at fault.")
    if result.error:
        lines.append("FAILED: " + ("the candidate did not build or load" if not result.compiled else "error"))
        lines.append(result.error)
        if result.log_tail and result.log_tail not in result.error:
            lines += ["-- output of the candidate process (tail) --", result.log_tail[-1500:]]
    for trial in result.trials:
        if trial.correct:
            err = f" (max abs error {trial.max_abs_error:.3g})" if trial.max_abs_error is not None else ""
            lines.append(f"trial {trial.trial + 1}: correct{err}")
        else:
            lines.append(f"trial {trial.trial + 1}: INCORRECT: {trial.message}")
    for violation in result.violations:
        lines.append(f"RULE VIOLATION: {violation}")
    if result.trials and not result.error:
        lines.append(f"correctness: {'PASS' if result.correct else 'FAIL'} ({sum(t.correct for t in result.trials)}/{len(result.trials)} trials, {_tolerance(result)})")
    if result.runtime or result.eager:
        lines.append(f"time: ModelNew {_ms(result.runtime_ms)} | eager {_ms(result.eager_ms)} | torch.compile {_ms(result.compile_ms)}  (median per call)")
        lines.append(f"speed-up: {speedup_text(result.speedup_vs_eager)} vs eager, {speedup_text(result.speedup_vs_compile)} vs torch.compile")
    lines.append(f"milestone: {milestone_text(result)}")
    baselines = " and ".join("torch.compile" if name == "compile" else name for name in result.close_calls if name != "floor")
    if baselines:
        lines.append(f"note: whether ModelNew is more than {result.speedup_margin:.0%} faster than {baselines} is "
                     "within this measurement's noise, after every call the timing run allowed, so that "
                     "milestone is not paid (a speed-up is paid where it clears the margin beyond the noise)")
    if "floor" in result.close_calls:
        lines.append("note: the time lies within this measurement's noise of the device's physical floor (the least "
                     "time its memory traffic can take); a time under the floor is paid no speed-up")
    return "\n".join(lines)
