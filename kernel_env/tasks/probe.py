"""Probe process for ``kernel_env.tasks.validate_task``: runs a task once, locked down.

Reads ``{"id", "code", "atol", "rtol", "screen"}`` on stdin and prints one JSON line: ``{"ok":
true, inputs, outputs, init_inputs, screen}`` or ``{"ok": false, "error": "..."}``. The task runs
under an audit hook that refuses to open files outside the Python installation, to touch the
network, or to start processes, so a task that would do any of these is reported, not obeyed.
Shapes are taken under FakeTensorMode first (no memory, no compute); only operators fake tensors
cannot handle fall back to a real run on the CPU.

The screen (``evaluators/child/screen.py``, the one the evaluation's judge runs on each task's
first job) then runs the task for real on the CPU where that is cheap (``_SCREEN_FLOPS``,
``_SCREEN_BYTES``, counted under fake tensors): the trials' inputs and their variants, which
trivial answers pass every trial, and which inputs the output does not depend on.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import traceback

TASK_FILENAME = "<task>"
#: A task is screened here when one forward costs at most this many floating-point operations and
#: its inputs and outputs at most this many bytes (a second or so of a CPU core); a larger one is
#: screened by each evaluation only.
_SCREEN_FLOPS = 2e10
_SCREEN_BYTES = 256 << 20
_SCREEN_TRIALS = 5


class Refused(PermissionError):
    pass


def _allowed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    roots |= {p for p in sys.path if p and os.path.isdir(p)}
    roots |= {"/dev/null", "/proc/self", "/sys/devices/system/cpu", "/proc/cpuinfo", "/usr/lib", "/usr/local/cuda", "/etc/ld.so.cache"}
    return tuple(sorted(os.path.realpath(r) for r in roots if r))


def _install_guard() -> None:
    roots = _allowed_roots()

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path = args[0]
            if isinstance(path, int) or path is None:
                return
            real = os.path.realpath(os.fsdecode(path))
            if not any(real == r or real.startswith(r + os.sep) for r in roots):
                raise Refused(f"tried to open {os.fsdecode(path)} (tasks must not read or write files)")
        elif event.startswith("socket.") and event not in ("socket.__new__",):
            raise Refused("tried to use the network (tasks must be self-contained)")
        elif event == "socket.__new__":
            raise Refused("tried to open a socket (tasks must be self-contained)")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn"):
            raise Refused("tried to start a process (tasks must be self-contained)")

    sys.addaudithook(hook)


def _task_line(exc: BaseException) -> str:
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == TASK_FILENAME:
            line = frame.lineno
    return f" (line {line} of the task)" if line else ""


def _refusal(exc: BaseException) -> Refused | None:
    """The guard's refusal behind an exception, also when a library wrapped it (urllib's URLError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, Refused):
            return exc
        seen.add(id(exc))
        reason = getattr(exc, "reason", None)
        exc = reason if isinstance(reason, BaseException) else (exc.__cause__ or exc.__context__)
    return None


def _describe(exc: BaseException, stage: str) -> str:
    refused = _refusal(exc)
    if refused is not None:
        return f"{stage} {refused}{_task_line(exc)}"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{stage} raised {type(exc).__name__}: {message}{_task_line(exc)}"


def _signature(value, label: str) -> list[dict]:
    import torch

    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            out.append({"shape": list(item.shape), "dtype": str(item.dtype).removeprefix("torch.")})
        elif isinstance(item, (int, float, bool)) and label == "input":
            out.append({"scalar": type(item).__name__})
        else:
            raise TypeError(f"{label} {i} is a {type(item).__name__}, not a tensor")
    if not out:
        raise TypeError(f"no {label}s")
    return out


def _run(namespace: dict, fake: bool) -> dict:
    import contextlib

    import torch

    stage = "get_init_inputs()"
    ctx = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        ctx = FakeTensorMode(allow_non_fake_inputs=True)
    with ctx, torch.no_grad():
        try:
            init = namespace["get_init_inputs"]()
            stage = "Model(*get_init_inputs())"
            model = namespace["Model"](*init)
            stage = "get_inputs()"
            inputs = namespace["get_inputs"]()
            if not isinstance(inputs, (list, tuple)):
                raise TypeError(f"get_inputs() returned a {type(inputs).__name__}, not a list")
            stage = "Model.forward"
            counter = torch.utils.flop_counter.FlopCounterMode(display=False)
            with counter:
                output = model(*inputs)
        except Exception as exc:
            if fake and _refusal(exc) is None and _is_fake_limitation(exc):
                raise _FakeUnsupported() from None
            raise _Failure(_describe(exc, stage)) from None
        tensors = [t for t in [*inputs, *(output if isinstance(output, (list, tuple)) else [output])] if isinstance(t, torch.Tensor)]
        report = {"init_inputs": [type(v).__name__ for v in init], "flops": counter.get_total_flops(),
                  "bytes": sum(t.numel() * t.element_size() for t in tensors)}
        for key, value, stage, label in (("inputs", inputs, "get_inputs()", "input"), ("outputs", output, "Model.forward", "output")):
            try:
                report[key] = _signature(value, label)
            except TypeError as exc:
                raise _Failure(f"{stage}: {exc}") from None
        return report


def _is_fake_limitation(exc: Exception) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("torch._subclasses", "torch._dynamo", "torch.fx")) or "fake" in str(exc).lower() or "meta" in str(exc).lower()


class _Failure(Exception):
    pass


def _screen(namespace: dict, atol: float, rtol: float) -> dict:
    """The evaluation's screen, run here on the CPU: ``{"refused": [...], "warnings": [...]}``."""
    import torch

    from kernel_env.evaluators.child import screen

    try:
        allowed = screen.task_variants(namespace)
    except ValueError as exc:
        raise _Failure(str(exc)) from None
    torch.manual_seed(0)
    with torch.no_grad():
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()

        def inputs_for(seed: int, variant: str) -> list:
            torch.manual_seed(seed)
            return screen.vary(list(namespace["get_inputs"]()), variant, seed)

        def run(inputs: list) -> list:
            out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            return [t.detach() for t in (out if isinstance(out, (list, tuple)) else [out])]

        answers = screen.TrivialAnswers(atol, rtol)
        warnings = []
        for index, variant in enumerate(screen.trial_variants(_SCREEN_TRIALS, allowed)):
            seed = 1000 + index
            outputs = None
            if variant != "as_is":
                try:
                    inputs = inputs_for(seed, variant)
                    outputs = run(inputs)
                except Exception as exc:  # noqa: BLE001 - outside the task's domain: its own inputs, as the evaluation does
                    warnings.append(f"the input variant {variant!r} makes the reference raise ({type(exc).__name__}), so "
                                    "that trial uses the task's own inputs; where this is an index out of range, on a GPU "
                                    "it is a device-side assert that ends every evaluation: name the variants the task "
                                    "accepts in INPUT_VARIANTS (docs/tasks.md)")
            if outputs is None or not screen.finite(outputs):
                inputs = inputs_for(seed, "as_is")
                outputs = run(inputs)
            answers.add(outputs, inputs)
        base, fresh = inputs_for(1000, "as_is"), inputs_for(2000, "as_is")  # another draw: in the task's domain
        expected = run(base)
        for j, (x, y) in enumerate(zip(base, fresh)):
            if screen.floating(x) and not torch.equal(x, y):
                try:
                    changed = run([y if k == j else v for k, v in enumerate(base)])
                except Exception:  # noqa: BLE001 - the inputs belong together (shapes, ranges): nothing to say
                    continue
                if all(torch.equal(a, b) for a, b in zip(expected, changed)):
                    warnings.append(f"the output does not depend on input {j} (changing it changed nothing)")
    return {"refused": answers.reasons(), "warnings": warnings}


class _FakeUnsupported(Exception):
    pass


def main() -> None:
    request = json.loads(sys.stdin.read())
    import torch  # noqa: F401  (imported before the guard so its own files load freely)
    import torch._subclasses.fake_tensor  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    import kernel_env.evaluators.child.screen  # noqa: F401

    torch.manual_seed(0)
    _install_guard()
    namespace: dict = {"__name__": "task_module"}
    try:
        try:
            exec(compile(request["code"], TASK_FILENAME, "exec"), namespace)
        except Exception as exc:
            stage = "at import" if _refusal(exc) is not None else "importing the task"
            raise _Failure(_describe(exc, stage)) from None
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if name not in namespace:
                raise _Failure(f"does not define {name}")
        try:
            report = _run(namespace, fake=True)
        except _FakeUnsupported:
            report = _run(namespace, fake=False)
        affordable = report.pop("flops") <= _SCREEN_FLOPS and report.pop("bytes") <= _SCREEN_BYTES
        if request.get("screen", True) and affordable:
            try:
                report["screen"] = _screen(namespace, request["atol"], request["rtol"])
            except _Failure:
                raise
            except Exception as exc:  # noqa: BLE001 - the task's own failure, named
                raise _Failure(_describe(exc, "screening (Model.forward on the trials' inputs)")) from None
        else:
            report["screen"] = None
    except _Failure as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return
    print(json.dumps({"ok": True, **report}))


if __name__ == "__main__":
    main()
