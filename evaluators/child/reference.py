"""The task's reference, on the judge's side: its inputs, its Model, its trials and their outputs.

Runs only the task's code and the harness's (the judge's process, ``judge.py``). ``init`` builds
the Model under the job's secret seed and saves its weights and init inputs for the worker;
``trials`` runs it on each trial's inputs (``screen``: varied in distribution and scale) and keeps
the outputs in this process's memory, never on disk; ``screen`` answers the synthesis filter's
questions about a task. The candidate never sees any of it: the judge hands a call's inputs to
the worker only as the call starts, and compares the worker's outputs here.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import precision
import screen
from bandwidth import distinct_bytes
from outputs import describe, flatten, is_plain, is_sequence
from protocol import ReferenceTrial, RefTrials, RefTrialsAnswer

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: The longest the device spins ahead of a timed forward (``Reference._preroll``): a forward whose host
#: launches take longer shows the rest in its time.
_PREROLL_MAX_S = 0.05
#: Types a non-tensor input may have: the judge hands them to the worker as JSON.
_PLAIN = (type(None), bool, int, float, str)


class Reference:
    def __init__(self, device: torch.device, task: dict, out_dir: Path):
        self.device, self.task, self.out_dir = device, task, out_dir
        self.model = None
        self.model32 = None  # a float32 copy of the Model, for half-precision tasks (``precise``)
        self._compiled = None  # torch.compile of the Model (``compiled``)
        self.contract: precision.Contract | None = None  # the precision contract of the Model (``init``)
        #: The threads a worker computes with (the process's default): the Model's own timings use them
        #: (``time_with``), while the judge otherwise keeps to one (``judge.Judge``).
        self.threads = torch.get_num_threads()
        #: per model, the host's time to launch a forward (``timed_call``): the last one's, at least half the one before
        self._launch_s: dict[int, float] = {}
        self._cycles_per_s: float | None = None  # the device's clock, for ``_preroll``: the fastest measured
        self._host_bound: set[int] = set()  # models whose forward waits on the host for its device work
        self.mutates_inputs = False  # the Model modifies its inputs in place (seen in its trials)
        #: Per trial: its seed and variant, and the Model's outputs (whether a sequence; the float32 run's).
        self.trials: list[dict] = []

    def make_inputs(self, seed: int, variant: str = "as_is") -> list:
        """The task's inputs for a seed, made on the device (``screen.vary`` reshapes a trial's)."""
        torch.manual_seed(seed)
        with torch.device(self.device):
            inputs = self.task["get_inputs"]()
        return screen.vary([x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs], variant, seed)

    def run(self, inputs: list, *, precise: bool = True) -> tuple[bool, list, list | None]:
        """(whether the Model returned a sequence, its outputs, the float32 run's or None) on ``inputs``,
        which stay as they are (the Model gets copies where it modifies its inputs)."""
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs] if self.mutates_inputs else inputs
        with torch.no_grad():
            out = self.model(*args)
        outputs = [t.detach() if isinstance(t, torch.Tensor) else t for t in flatten(out)]
        return is_sequence(out), outputs, self.precise(inputs, outputs) if precise else None

    def precise(self, inputs: list, outputs: list) -> list | None:
        """The Model run in float32 on ``inputs`` (their float16 and bfloat16 tensors made float32),
        each output rounded once to its dtype: for a task with float16 or bfloat16 outputs, where the
        float32 run gives outputs of the same shapes. A fused kernel that computes in float32 and
        rounds once differs from the task's own run, which rounds at every step, by more than the
        tolerance at times (``x * y + x`` in bfloat16); it matches this one. None otherwise."""
        if not any(isinstance(t, torch.Tensor) and t.dtype in _LOW_PRECISION for t in outputs):
            return None
        try:
            if self.model32 is None:
                self.model32 = copy.deepcopy(self.model).float()
            # Copies (``float()`` of a half tensor is one): the Model may change its inputs in place.
            wide = [(x.float() if x.dtype in _LOW_PRECISION else x.clone()) if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                got = flatten(self.model32(*wide))
        except Exception:  # noqa: BLE001 - the task does not run in float32: its own run is the only reference
            return None
        if len(got) != len(outputs) or any(not isinstance(g, torch.Tensor) or g.shape != t.shape for g, t in zip(got, outputs)):
            return None
        return [g.detach().to(t.dtype) for g, t in zip(got, outputs)]

    # ------------------------------------------------------------------ the harness's commands

    def init(self, init_seed: int) -> None:
        """Build the Model under ``init_seed``; save its weights and init inputs for the worker."""
        torch.manual_seed(init_seed)
        init = self.task["get_init_inputs"]()
        try:
            torch.save(init, self.out_dir / "init_inputs.pt")
        except Exception:  # noqa: BLE001 - not picklable (torch.channels_last): the worker makes them itself
            torch.save(None, self.out_dir / "init_inputs.pt")
        torch.manual_seed(init_seed)
        self.model = self.task["Model"](*init).to(self.device).eval()
        self.contract = precision.Contract(self.model, self.task)
        torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, self.out_dir / "state_dict.pt")

    def run_trials(self, req: RefTrials) -> RefTrialsAnswer:
        """Each trial's outputs, kept; its variant (``screen``); the trivial answers that pass them
        all (``screen.TrivialAnswers``). A variant that takes the Model out of its domain (it raises,
        or its output is not finite) gives way to the task's own inputs."""
        try:
            allowed = screen.task_variants(self.task)
        except ValueError as exc:
            return RefTrialsAnswer(error=f"the task's {exc}")
        variants = screen.trial_variants(len(req.seeds), allowed) if req.vary else ["as_is"] * len(req.seeds)
        answers = screen.TrivialAnswers(req.atol, req.rtol, search=req.screen, device=self.device)
        reports, timed_bytes = [], 0
        for seed, variant in zip(req.seeds, variants):
            inputs, pristine, out = self._trial(seed, variant)
            if variant != "as_is" and (out is None or not screen.finite(
                    [t for t in flatten(out) if isinstance(t, torch.Tensor)])):
                variant, inputs, pristine, out = "as_is", None, None, None  # freed before the second call
                inputs, pristine, out = self._trial(seed, variant)
            unplain = [type(x).__name__ for x in inputs if not isinstance(x, torch.Tensor) and not _plain(x)]
            if unplain:
                return RefTrialsAnswer(error=f"the task's get_inputs() returns {', '.join(unplain)}: inputs must be "
                                             "tensors, numbers, strings or lists of them")
            outputs = flatten(out)
            kinds = [describe(t) for t in outputs if not is_plain(t)]
            mutated = any(isinstance(a, torch.Tensor) and (a.shape != b.shape or not torch.equal(a.nan_to_num(), b.nan_to_num()))
                          for a, b in zip(inputs, pristine))
            self.mutates_inputs |= mutated
            if not kinds:
                call_bytes = sum(t.nbytes for t in [*pristine, *outputs] if isinstance(t, torch.Tensor))
                kept = self._kept([t.detach() for t in outputs], call_bytes)
                precise = self.precise(pristine, kept)
                precise = self._kept(precise, call_bytes) if precise is not None else None
                self.trials.append({"seed": seed, "variant": variant, "sequence": is_sequence(out),
                                    "expected": kept, "precise": precise})
                if variant == "as_is":  # the bytes a timed call moves (its inputs are made as these are)
                    timed_bytes = max(timed_bytes, sum(distinct_bytes(t) for t in [*pristine, *outputs]
                                                       if isinstance(t, torch.Tensor)))
                answers.add(kept, pristine, precise)  # a trivial answer that passes either reference counts
            reports.append(ReferenceTrial(variant=variant, mutated_inputs=mutated, non_tensor_outputs=kinds))
            del out, outputs, inputs, pristine
        # What the trials' inputs and outputs took goes back to the device, not to torch's cache: the
        # shared buffers of the calls to come are the device's own allocations, which cannot use it.
        torch.cuda.empty_cache()  # (nothing where CUDA was never initialised: the CPU)
        return RefTrialsAnswer(trials=reports, trivial=answers.reasons(), call_bytes=timed_bytes)

    def _trial(self, seed: int, variant: str) -> tuple:
        """(inputs, a copy of them as made, the output) of one trial. On a variant's inputs, a
        Model that raises (or a variant that cannot reshape them: an expanded tensor, infinite
        bounds) gives the output None."""
        try:
            inputs = self.make_inputs(seed, variant)
            pristine = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                out = self.model(*inputs)
        except Exception:
            if variant == "as_is":
                raise
            return None, None, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return inputs, pristine, out

    def _kept(self, outputs: list[torch.Tensor], call_bytes: int) -> list[torch.Tensor]:
        """Copies (an output may be a view of an input or a buffer), on the device while it keeps free
        a quarter of its memory, and at least three times what one call's inputs and outputs take
        (``call_bytes``: a call's shared buffers, the judge's inputs and expected outputs, the
        worker's outputs and the judge's copy of them), else in this process's host memory."""
        free, total = torch.cuda.mem_get_info(self.device) if self.device.type == "cuda" else (0, 0)
        on_device = sum(t.nbytes for t in outputs) < free - max(total // 4, 3 * call_bytes)
        return [t.clone() if on_device else t.to("cpu", copy=True) for t in outputs]

    def time(self, calls: int, warmup: int, flush_bytes: int, models: list[str] = ("eager",)) -> dict[str, list[float]]:
        """Milliseconds of each of ``calls`` calls of each of ``models`` (``eager``: the Model;
        ``compile``: torch.compile of it) in this process, alternating, each pair on fresh inputs
        (``timed_call``). ``warmup`` calls of each first (torch.compile compiles in its first)."""
        flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device=self.device)
        return self.time_with(flush, calls, warmup, models)

    def time_with(self, flush: torch.Tensor, calls: int, warmup: int, models=("eager",)) -> dict[str, list[float]]:
        """``time`` with a flush buffer of the caller's. The worker's threads throughout (``threads``): on
        the CPU a change of torch's thread count costs its next parallel region, so not one per call."""
        runs = {name: self.compiled() if name == "compile" else self.model for name in models}
        times: dict[str, list[float]] = {name: [] for name in models}
        with _threads(self.threads):
            for index in range(warmup + calls):
                inputs = self.make_inputs(index)
                for name, model in runs.items():
                    elapsed = self.timed_call(model, inputs, flush)
                    if index >= warmup:
                        times[name].append(elapsed)
        return times

    def timed_call(self, model, inputs: list, flush: torch.Tensor) -> float:
        """Milliseconds of one forward of ``model`` on ``inputs`` in this process: the caches flushed
        first, then device events around the forward on a GPU, the process's clock on the CPU. On a
        GPU the device is kept busy (``_preroll``) until the host has launched the whole forward, so
        the time is the device's, as a worker's call is timed (queued ahead of its start): not the
        host's launches, which a slow host or a compiled model's guards otherwise put into a small
        kernel's time several times over.

        That it was is checked, not assumed: a call whose start the device reached before the host had
        launched the whole forward (a slow host, or a clock that ran faster than when it was measured)
        is made again, once, with the clock measured anew and four times the spin. A forward that
        still is not (it waits on the host for its own device work) is timed as it runs, without that
        second try, until a call of it is queued ahead again."""
        def fresh() -> list:
            return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs] if self.mutates_inputs else inputs

        with torch.no_grad():
            if self.device.type != "cuda":
                args = fresh()
                flush.bitwise_not_()
                began = time.perf_counter_ns()
                model(*args)
                return (time.perf_counter_ns() - began) / 1e6
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for spin in (1, 4):
                args = fresh()
                launch_s = self._launch_s.get(id(model), 1e-3)
                self._preroll(spin * launch_s)
                flush.bitwise_not_()
                start.record()
                launching = time.perf_counter()
                model(*args)
                self._launch_s[id(model)] = max(time.perf_counter() - launching, launch_s / 2)
                ahead = not start.query()  # the device had not reached the forward when its last launch was queued
                end.record()
                end.synchronize()
                if ahead:
                    self._host_bound.discard(id(model))
                    break
                if spin > 1 or id(model) in self._host_bound:
                    self._host_bound.add(id(model))  # twice in a row: it waits on the host, until a call is ahead
                    break
                self._measure_clock()
            return start.elapsed_time(end)

    def _preroll(self, launch_s: float) -> None:
        """A kernel that spins on the device for three times the time the forward's launches took lately
        (a forward that waits on the host for its device work only ends the spin sooner)."""
        if self._cycles_per_s is None:
            self._measure_clock()
        seconds = min(3 * launch_s + 50e-6, _PREROLL_MAX_S)
        torch.cuda._sleep(int(seconds * self._cycles_per_s))

    def _measure_clock(self) -> None:
        """The device's cycles per second, as ``torch.cuda._sleep`` counts them: the fastest measured so
        far (a device idle until now may still be at a low clock, which would shorten every later spin)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1 << 20)
        end.record()
        end.synchronize()
        measured = (1 << 20) / max(start.elapsed_time(end) / 1e3, 1e-6)
        self._cycles_per_s = max(self._cycles_per_s or 0.0, measured)

    def compiled(self):
        """torch.compile of the Model, made once (it compiles at its first call)."""
        if self._compiled is None:
            self._compiled = torch.compile(self.model)
        return self._compiled

    def screen(self, seeds: list[int], compile: bool) -> dict:
        """Facts for the synthesis filter (``kernel_env.workloads.runs.synth.filter``, which decides; nothing here does).

        Without ``compile``: the Model on the inputs of ``seeds[0]`` twice (fresh copies, the random
        state moving on between the calls, as it would in use) and on those of ``seeds[1]`` once;
        reports the outputs' signatures, whether they are finite, each output's spread (max - min),
        the largest difference between the two identical calls and between the two inputs, and the
        largest magnitude. With ``compile``: ``torch.compile(Model)`` on the inputs of ``seeds[0]``
        against eager; reports the largest difference and its allowed tolerance's scale."""
        first = self.make_inputs(seeds[0])
        with torch.no_grad():
            eager = flatten(self.model(*_copies(first)))
            if compile:
                compiled = flatten(torch.compile(self.model)(*_copies(first)))
                return {"compile_max_diff": _max_diff(eager, compiled), "scale": _scale(eager)}
            again = flatten(self.model(*_copies(first)))
            other = flatten(self.model(*self.make_inputs(seeds[1])))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        kinds = [type(t).__name__ for t in eager if not isinstance(t, torch.Tensor)]
        if kinds:
            return {"non_tensor_outputs": kinds}
        return {
            "non_tensor_outputs": [],
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager],
            "finite": all(bool(torch.isfinite(t).all()) for t in eager if t.is_floating_point() or t.is_complex()),
            "spreads": [_spread(t) for t in eager],
            "numels": [t.numel() for t in eager],
            "repeat_max_diff": _max_diff(eager, again),
            "input_max_diff": _max_diff(eager, other),
            "scale": _scale(eager),
        }


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` inside the block (the CPU; a no-op where they already are)."""
    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _copies(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _max_diff(a: list, b: list) -> float:
    """Largest elementwise difference between two output lists (inf where shapes, dtypes or NaN positions
    differ). Works in the outputs' own precision (float32 at least), so gigabyte outputs are not doubled."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return float("inf")
        if x.shape != y.shape or x.dtype != y.dtype:
            return float("inf")
        if x.numel() == 0:
            continue
        x, y = x.detach(), y.detach()
        if x.is_floating_point() or x.is_complex():
            if not torch.equal(torch.isnan(x), torch.isnan(y)):
                return float("inf")
            diff = (x - y).abs() if x.is_complex() else (x.float() - y.float()).abs()
            diff = torch.where(torch.isnan(diff), 0.0, diff)  # NaN in both, or the same infinity in both
        else:
            diff = (x.long() - y.long()).abs()
        worst = max(worst, float(diff.max()))
    return worst


def _finite_range(t: torch.Tensor) -> tuple[float, float] | None:
    """(min, max) over the finite elements (the real part of complex ones), or None if there are none."""
    values = (t.real if t.is_complex() else t).detach()
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    if values.is_floating_point() and not bool(torch.isfinite(values).all()):
        values = values[torch.isfinite(values)]  # a copy, only where something is not finite
    if values.numel() == 0:
        return None
    low, high = torch.aminmax(values)
    return float(low), float(high)


def _spread(t: torch.Tensor) -> float:
    """max - min over the finite elements (0 for none): zero means a constant output."""
    found = _finite_range(t)
    return found[1] - found[0] if found else 0.0


def _scale(outputs: list) -> float:
    """Largest finite magnitude among the outputs (the scale a relative tolerance refers to)."""
    scale = 0.0
    for t in outputs:
        found = _finite_range(t) if isinstance(t, torch.Tensor) else None
        if found:
            scale = max(scale, abs(found[0]), abs(found[1]))
    return scale
