"""What a task's trials are made of, and which trivial answers would pass them (issue 26).

- ``VARIANTS``, ``trial_variants``, ``task_variants``, ``vary``: each trial's inputs drawn under
  its own secret seed, then reshaped (uniform, scaled, shifted), so that a kernel that holds only
  for the task's own distribution (a polynomial fit of GELU on [-4, 4], a mean assumed zero) fails.
- ``TrivialAnswers``: which answers that compute nothing (zeros, a constant, the first trial's
  output replayed, an input passed through) pass every trial at the evaluator's tolerance.
- ``finite``: whether outputs are free of NaN and Inf.

The rules, and what was measured with them: docs/tasks.md, Screening. Imported by the evaluation
children by its bare name (``import screen``), and on the host as
``kernel_env.evaluators.child.screen`` (the task probe screens with it too): it imports nothing of
kernel_env, only torch and its sibling ``compare``.
"""

from __future__ import annotations

import math

import torch

if __package__:
    from . import compare
else:  # an evaluation child: the siblings are top-level modules there
    import compare

VARIANTS = ("as_is", "uniform", "scaled_up", "shifted", "scaled_down")
_SCALE = 4.0


def trial_variants(count: int, allowed: tuple[str, ...] | None = None) -> list[str]:
    """The variant of each of ``count`` trials: ``VARIANTS`` in turn, those the task allows.

    Args:
        count: the number of trials.
        allowed: the variants the task accepts (``task_variants``); None: all of them.

    Returns:
        One name of ``VARIANTS`` per trial, the first "as_is" where the task allows it."""
    usable = [v for v in VARIANTS if allowed is None or v in allowed] or ["as_is"]
    return [usable[index % len(usable)] for index in range(count)]


def task_variants(namespace: dict) -> tuple[str, ...] | None:
    """The variants a task declares it accepts.

    Args:
        namespace: the task module's globals, where ``INPUT_VARIANTS`` may be (a name or a tuple).

    Returns:
        The declared names, or None when the task declares none.

    Raises:
        ValueError: the declaration is empty or names something not in ``VARIANTS``."""
    declared = namespace.get("INPUT_VARIANTS")
    if declared is None:
        return None
    names = (declared,) if isinstance(declared, str) else tuple(declared)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise ValueError(f"INPUT_VARIANTS names {unknown or 'nothing'}; choose among {', '.join(VARIANTS)}")
    return names


def vary(inputs: list, variant: str, seed: int) -> list:
    """The task's inputs for one trial, reshaped by ``variant`` (``as_is``: unchanged). In place:
    the inputs are the trial's own, fresh from ``get_inputs()``, and a task's inputs may fill most
    of the device (a KernelBench level-1 task's, 24 GiB of an H100's 80). A task whose
    ``get_inputs()`` returns a tensor it keeps (a module-level one) sees it reshaped for good:
    both processes alike, so the judgement holds, but its timing then uses the reshaped values;
    such a task declares ``INPUT_VARIANTS = ("as_is",)``.

    Args:
        inputs: what ``get_inputs()`` returned; only floating-point tensors of more than one element
            change, and a storage given twice is reshaped once.
        variant: one of ``VARIANTS``.
        seed: the trial's seed (the uniform variant's draw).

    Returns:
        ``inputs`` itself.

    Raises:
        ValueError: ``variant`` is not one of ``VARIANTS``.
        RuntimeError: a tensor cannot be reshaped in place (an expanded one); the trial then uses
            the task's own inputs."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown input variant {variant!r}")
    if variant == "as_is":
        return inputs
    varied = set()  # storages already reshaped: an input given twice (or two views of one) is reshaped once
    with torch.no_grad():
        for x in inputs:
            if floating(x) and x.untyped_storage().data_ptr() not in varied:
                varied.add(x.untyped_storage().data_ptr())
                _vary_tensor(x, variant, seed)
    return inputs


def floating(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1


def _vary_tensor(x: torch.Tensor, variant: str, seed: int) -> None:
    if variant == "uniform":
        low, high = (float(v) for v in torch.aminmax(x))
        if low < high:  # a constant input stays as it is
            x.uniform_(low, high, generator=torch.Generator(device=x.device).manual_seed(seed ^ 0x5EED))
    elif variant == "scaled_up":
        x.mul_(_SCALE)
    elif variant == "scaled_down":
        x.div_(_SCALE)
    elif variant == "shifted":  # down by its mean and one deviation: an input made positive takes negative values too
        x.sub_(float(x.mean()) + float(x.std()))


#: Elements per chunk when the screen compares a whole output with an answer: the comparison's own
#: (its work tensors stay a few hundred MB however large the output).
_CHUNK = compare._CHUNK


def finite(outputs: list[torch.Tensor], device: torch.device | None = None) -> bool:
    """Whether every output is free of NaN and Inf, looked at a chunk at a time.

    Args:
        outputs: the tensors to look at (only floating-point and complex ones can hold NaN or Inf).
        device: where the chunks are looked at; None: where each output is.

    Returns:
        True when none holds a NaN or an Inf."""
    return all(bool(torch.isfinite(chunk.to(device or chunk.device)).all()) for t in outputs
               if t.is_floating_point() or t.is_complex() for chunk in t.reshape(-1).split(_CHUNK))


class TrivialAnswers:
    """Which trivial answers pass every trial seen so far (``add`` each trial's outputs, with the
    inputs it was given, before the model ran), at the evaluator's tolerance.

    An answer passes a trial when it passes the reference's outputs or, for a half-precision task,
    the float32 run's (``precise``): either is accepted from a candidate. Constants are tested
    exactly: each element ``r`` admits the interval ``r ± (atol + rtol * |r|)``, and some constant
    passes every trial when the intersection over every element and trial is not empty.

    Args:
        atol, rtol: the evaluator's tolerance.
        search: False checks only that the outputs are finite (a task already screened).
        device: where the work is done, a chunk at a time; None: where each output is. The judge
            keeps a trial's outputs in host memory when the device is short; screened there, a
            KernelBench level-1 task's five 6 GiB outputs took four judges side by side past the
            step's 300 s bound."""

    def __init__(self, atol: float, rtol: float, *, search: bool = True, device: torch.device | None = None) -> None:
        self.atol, self.rtol, self.device = atol, rtol, device
        self.search = search  # False: only the outputs' finiteness is checked (a task already screened)
        self.trials = 0
        self.non_finite: int | None = None  # the first trial (1-based) whose output was not finite
        self._first: list[torch.Tensor] = []
        self._alive: list[dict[str, bool]] = []  # per output: answer -> passed every trial so far
        # per output, per reference (eager, then float32): the constants every element so far admits
        self._bounds: list[list[list[float] | None]] = []

    def add(self, outputs: list[torch.Tensor], inputs: list, precise: list[torch.Tensor] | None = None) -> None:
        """Take in one trial.

        Args:
            outputs: the reference's outputs of the trial (the first trial's are kept, to replay).
            inputs: the inputs the trial was given, as they were before the model ran.
            precise: the float32 run's outputs, for a half-precision task; None otherwise."""
        self.trials += 1
        if self.non_finite is None and not finite(outputs, self.device):
            self.non_finite = self.trials
        if not self.search:
            return
        if self.trials == 1:
            self._first = outputs
            self._alive = [self._candidates(out, inputs) for out in outputs]
            self._bounds = [[[-math.inf, math.inf], [-math.inf, math.inf]] if out.is_floating_point() else [None, None]
                            for out in outputs]
        for index, out in enumerate(outputs[:len(self._alive)]):
            targets = [out] + ([precise[index]] if precise is not None and index < len(precise) else [])
            bounds = self._bounds[index]
            for which in range(2):
                if bounds[which] is not None:
                    bounds[which] = self._narrowed(bounds[which], targets[which]) if which < len(targets) else None
            alive = self._alive[index]
            alive["a constant"] = any(b is not None and b[0] <= b[1] for b in bounds)
            for name in [n for n, ok in alive.items() if ok and n != "a constant"]:
                alive[name] = any(self._passes(name, index, target, inputs) for target in targets)

    def _candidates(self, out: torch.Tensor, inputs: list) -> dict[str, bool]:
        names = ["zeros", "a constant", "the first trial's output"]
        names += [f"input {j}" for j, x in enumerate(inputs) if isinstance(x, torch.Tensor) and tuple(x.shape) == tuple(out.shape)]
        return dict.fromkeys(names, True)

    def _narrowed(self, bound: list[float], target: torch.Tensor) -> list[float] | None:
        """``bound`` intersected with the constants every element of ``target`` admits (None: none can pass)."""
        if not target.is_floating_point():
            return None
        low, high = bound
        for chunk in target.detach().reshape(-1).split(_CHUNK):
            if not chunk.numel():
                continue
            wide = chunk.to(self.device or chunk.device).double()
            tolerance = wide.abs().mul_(self.rtol).add_(self.atol)
            low = max(low, float((wide - tolerance).max()))
            high = min(high, float((wide + tolerance).min()))
        return [low, high]

    def _passes(self, name: str, index: int, out: torch.Tensor, inputs: list) -> bool:
        """Whether the answer ``name`` passes ``out`` (the comparison's rule, ``compare.py``), chunk by chunk."""
        first = self._first[index]
        if name == "the first trial's output" and first.shape != out.shape:
            return False
        source = first if name == "the first trial's output" else inputs[int(name[6:])] if name.startswith("input ") else None
        flat = out.reshape(-1)
        source_flat = source.detach().reshape(-1) if source is not None else None
        device = self.device or out.device
        for start in range(0, max(flat.numel(), 1), _CHUNK):
            expected = flat[start:start + _CHUNK].to(device)
            if source_flat is not None:
                answer = source_flat[start:start + _CHUNK].to(device=device, dtype=out.dtype)
            else:
                answer = torch.zeros_like(expected)
            if not compare.compare_outputs(0, expected, answer, self.atol, self.rtol).correct:
                return False
        return True

    def passing(self) -> list[list[str]]:
        """Per output, the trivial answers that passed every trial so far ("zeros", "a constant",
        "the first trial's output", "input J"); none before a second trial."""
        if self.trials < 2:
            return [[] for _ in self._alive]
        return [[name for name, ok in alive.items() if ok] for alive in self._alive]

    def reasons(self) -> list[str]:
        """Why the task cannot be evaluated.

        Returns:
            One sentence per reason ("returning the constant 1 as the output passes every trial",
            or that the reference's output is not finite); empty when the task can be evaluated."""
        if self.non_finite is not None:
            return [f"the reference's output is not finite (NaN or Inf in trial {self.non_finite})"]
        if not self._alive or self.trials < 2:
            return []
        passing = self.passing()
        if not all(passing):
            return []
        label = (lambda k: f"output {k}") if len(passing) > 1 else (lambda k: "the output")
        return [f"returning {self._describe(names[0], k)} as {label(k)} passes every trial" for k, names in enumerate(passing)]

    def _describe(self, name: str, index: int) -> str:
        if name == "a constant":
            low, high = next(b for b in self._bounds[index] if b is not None and b[0] <= b[1])
            return f"the constant {(low + high) / 2:.4g}"
        if name == "the first trial's output":
            return "the first trial's output for every input (the output barely depends on its inputs)"
        return f"{name} unchanged" if name.startswith("input") else name
