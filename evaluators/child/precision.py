"""The precision contract: a task's dtype is the precision its answer must have (the judge's side).

A float32 task computed with float16, bfloat16 or TF32 tensor-core math passes a 1e-2 tolerance
and is paid a speed that is not there at the task's precision (a Triton ``tl.dot`` on float32
operands computes in TF32 unless told ``input_precision="ieee"``). So on a few checked calls the
judge also runs the task's Model in float64 on the call's inputs, the answer to more bits than the
task's dtype holds, and measures each output's relative error against it (``error``: the L2 norm
of the difference over the reference's, where the reference is finite):

- **eager's**: the task's own outputs on those inputs, what the task's own code shows at its dtype
  (never taken below the dtype's unit roundoff: a task whose eager answer is exact leaves room
  for an honest kernel's last bits);
- **the downgrade's**: the Model in float64 on its operands (inputs, weights, buffers) rounded to
  the mantissa a lower precision keeps (``KEPT_BITS``: float32 to 10 bits, as TF32 and float16
  keep; float16 to 3 and bfloat16 to 2, as float8 keeps), the least error tensor-core math of
  that kind shows (it rounds every operand so, and its intermediates besides);
- **the candidate's**.

A candidate is refused when its error is above the limit (``Measure.limit``), the least of:

- **far above eager's**: ``SENSITIVE_BITS`` (4) bits of error more than the task's own code shows,
  and at least a quarter of the downgraded precision's unit roundoff (a float32 task: 2^-12, which
  no honest float32 kernel reaches short of a naive sum of tens of millions of terms; bfloat16
  math shows 1e-3 and more);
- **halfway to the downgrade**, where the task's answer shows its precision (the downgrade's error
  at least ``SENSITIVE`` (2^8) times eager's: operands of either sign, whose rounding does not
  average out): the geometric mean of eager's error and the downgrade's, halfway in bits from the
  task's own code to the downgrade (a float32 matmul over K = 2048 on randn operands: eager 2.5e-7,
  the limit 8e-6, TF32 3e-4).

Summation orders, FMA, fast-math intrinsics and honest kernels at the task's dtype stay within a
few times eager's error, and the limit is at least 16 times it. Where the operands' rounding
averages out (sums of same-sign terms: a matmul of ``torch.rand`` operands), a downgrade that keeps
float32 accumulation (TF32, float16 operands) shows an error of 1e-5 to 1e-4 (KernelBench level 1's
matmuls on an H200, 25 to 600 times eager's): there the rounding of the operands is no larger than
what an honest float32 kernel summing the same terms in another order shows (a naive loop over
K = 16384 terms: 13 times eager's; a global sum by atomics over a million partial sums: 1e-5), so
nothing tells the two apart and it is not refused; outputs rounded to a lower precision
(bfloat16: 1e-3) are. A task that accepts lower precision says so: ``LOWER_PRECISION = True`` in
its module. A float64 task has no wider reference and is not checked; neither is a Model that does
not run in float64 (the note says why). docs/security.md, The precision contract, has what was
measured.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

#: The mantissa bits a downgrade of each dtype keeps (TF32 and float16 keep 10; float8 keeps 3 (e4m3)
#: or 2 (e5m2): bfloat16's own 7 are within 4 bits of e4m3's, too near to tell apart).
KEPT_BITS = {torch.float32: 10, torch.float16: 3, torch.bfloat16: 2}
#: Each dtype's unit roundoff (half a unit in the last place, relative): the least error eager is taken to have.
_UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
#: The least error, in bits above eager's, for which a candidate is refused (the limit is at least 16 times eager's).
SENSITIVE_BITS = 4
#: A task's answer shows its precision where the downgrade's error is this many times eager's or more:
#: a naive float32 sum of same-sign terms is up to ~2^4 times eager's error, and the geometric mean
#: of eager's and the downgrade's is then still 2^4 times eager's.
SENSITIVE = 2.0 ** 8
#: Elements per chunk of an error's sums (float64 work tensors of 32 MB each).
_CHUNK = 1 << 22
#: A call whose tensors take this much at most is held to the contract on the host where its device
#: has no room for the float64 run.
_HOST_BYTES = 256 << 20


@dataclass
class Measure:
    """One call's precision, for the output nearest its limit (or the note on why it was not checked)."""
    refused: bool = False
    error: float | None = None        # the candidate's relative error against the float64 reference
    eager_error: float | None = None  # the task's own code's, on the same inputs
    limit: float | None = None        # above this the candidate is refused
    output: int = 0
    note: str | None = None           # why the call was not checked

    def message(self, outputs: int) -> str:
        label = f"output {self.output}" if outputs > 1 else "output"
        return (f"{label} is less precise than the task's dtype: its error against a float64 reference is "
                f"{self.error:.2e}, the task's own code's {self.eager_error:.2e}, the limit {self.limit:.2e}. "
                f"Compute in the task's dtype: no float16, bfloat16 or TF32 math on float32 data (a Triton tl.dot "
                f"on float32 operands computes in TF32 unless given input_precision=\"ieee\"); docs/security.md, "
                f"The precision contract")


class Contract:
    """The precision contract of one task's Model (``measure``); its float64 copies are made at first use,
    on the Model's device, and on the host where the device has no room for a call's float64 run."""

    def __init__(self, model: torch.nn.Module, task: dict):
        self.model = model
        self.waived = bool(task.get("LOWER_PRECISION", False))
        self._models: dict[tuple[str, str], torch.nn.Module] = {}  # (exact or downgraded, device type)
        #: per input variant (``screen.VARIANTS``), the downgrade's error of each output, measured at its first call
        self._downgrade_errors: dict[str, list[float | None]] = {}
        self.broken: str | None = None  # why the Model cannot be checked (it does not run in float64, ...)

    def measure(self, inputs: list, eager: list, candidate: list, variant: str = "as_is") -> Measure:
        """The candidate's outputs on ``inputs`` (drawn as ``variant`` draws them) against the task's
        (``eager``), both against the Model in float64. ``candidate`` already passed the tolerance
        (same shapes and dtypes as ``eager``). Where the device has no room for the float64 run (the
        candidate's own memory, or a neighbour's), it runs on the host if the call's tensors take
        ``_HOST_BYTES`` at most; a larger call is then not checked, and the note says so."""
        checked = [i for i, t in enumerate(eager) if isinstance(t, torch.Tensor) and t.dtype in KEPT_BITS]
        if self.waived:
            return Measure(note="not checked: the task accepts lower precision (LOWER_PRECISION)")
        if not checked:
            return Measure(note="not checked: no float32, float16 or bfloat16 output")
        if self.broken is not None:
            return Measure(note=self.broken)
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        try:
            return self._measure(inputs, eager, candidate, variant, checked, device)
        except torch.OutOfMemoryError:
            self._models = {key: model for key, model in self._models.items() if key[1] == "cpu"}
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - the task's code, run in a dtype it may not support
            self.broken = f"not checked: the Model does not run in float64 ({type(exc).__name__}: {str(exc)[:120]})"
            self._models = {}
            return Measure(note=self.broken)
        call_bytes = sum(t.nbytes for t in [*inputs, *eager] if isinstance(t, torch.Tensor))
        if device.type == "cpu" or call_bytes > _HOST_BYTES:
            return Measure(note="not checked: no room on the device for this call's run in float64")
        try:
            return self._measure(inputs, eager, candidate, variant, checked, torch.device("cpu"))
        except Exception as exc:  # noqa: BLE001 - as above
            return Measure(note=f"not checked: the Model's float64 run on the host failed ({type(exc).__name__})")

    def _measure(self, inputs: list, eager: list, candidate: list, variant: str, checked: list[int],
                 where: torch.device) -> Measure:
        exact = self._run(self._model("exact", where), inputs, None, where)
        if variant not in self._downgrade_errors:
            low = self._run(self._model("downgraded", where), inputs, KEPT_BITS, where)
            self._downgrade_errors[variant] = [error(low[i], exact[i]) if i in checked else None for i in range(len(eager))]
            del low
        found = []
        for i in checked:
            if len(exact) != len(eager) or exact[i].shape != eager[i].shape:
                return Measure(note="not checked: the Model in float64 returns other outputs")
            own, low = error(eager[i], exact[i]), self._downgrade_errors[variant][i]
            if own is None or low is None:
                continue
            own = max(own, _UNIT[eager[i].dtype])
            theirs = error(candidate[i], exact[i])
            theirs = math.inf if theirs is None else theirs
            limit = refusal_limit(own, low, eager[i].dtype)
            found.append(Measure(refused=theirs > limit, error=theirs, eager_error=own, limit=limit, output=i))
        if not found:
            return Measure(note="not checked: the reference's outputs are zero or not finite")
        return max(found, key=lambda m: (m.refused, m.error / m.limit))

    def _model(self, kind: str, where: torch.device) -> torch.nn.Module:
        """The Model in float64 on ``where``: ``exact``, or ``downgraded`` (its weights rounded first)."""
        key = (kind, where.type)
        if key not in self._models:
            model = copy.deepcopy(self.model)
            if kind == "downgraded":
                with torch.no_grad():
                    for tensor in [*model.parameters(), *model.buffers()]:
                        if tensor.dtype in KEPT_BITS:
                            tensor.copy_(rounded(tensor, KEPT_BITS[tensor.dtype]))
            self._models[key] = model.double().to(where)
        return self._models[key]

    @staticmethod
    def _run(model: torch.nn.Module, inputs: list, bits: dict | None, where: torch.device) -> list:
        """``model``'s outputs on float64 copies of ``inputs`` on ``where`` (each rounded first to ``bits`` of its dtype)."""
        wide = []
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                x = rounded(x, bits[x.dtype]) if bits and x.dtype in bits else x
                wide.append(x.to(where, torch.float64))
            else:
                wide.append(x.to(where, copy=True) if isinstance(x, torch.Tensor) else x)
        with torch.no_grad():
            out = model(*wide)
        return [t.detach() if isinstance(t, torch.Tensor) else t for t in (out if isinstance(out, (list, tuple)) else [out])]


def refusal_limit(eager_error: float, downgrade_error: float, dtype: torch.dtype) -> float:
    """The error above which an answer of ``dtype`` is refused, given eager's (at least the dtype's unit
    roundoff) and the downgrade's on the same inputs (the module's docstring says why)."""
    limit = max(2.0 ** SENSITIVE_BITS * eager_error, 2.0 ** -(KEPT_BITS[dtype] + 2))
    if downgrade_error >= SENSITIVE * eager_error:
        limit = min(limit, math.sqrt(eager_error * downgrade_error))
    return limit


def rounded(t: torch.Tensor, bits: int) -> torch.Tensor:
    """``t`` (float32, float16 or bfloat16) with its mantissa rounded to the nearest of ``bits`` bits,
    in its own dtype; what is not finite stays as it is."""
    wide = t.float()
    drop = 23 - bits
    pattern = wide.view(torch.int32)
    kept = ((pattern + (1 << (drop - 1))) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(wide), kept, wide).to(t.dtype)


def error(out: torch.Tensor, exact: torch.Tensor) -> float | None:
    """The relative L2 error of ``out`` against ``exact`` over the elements both hold finite (a
    mismatch of NaN or infinity is the tolerance's to judge), summed chunk by chunk where ``exact``
    is; None where ``exact`` is zero there."""
    a, b = out.detach().reshape(-1), exact.detach().reshape(-1)
    num = den = 0.0
    for start in range(0, b.numel(), _CHUNK):
        r = b[start:start + _CHUNK].to(torch.float64)
        c = a[start:start + _CHUNK].to(b.device, torch.float64)
        finite = torch.isfinite(r) & torch.isfinite(c)
        num += float(torch.where(finite, c - r, 0.0).square().sum())
        den += float(torch.where(finite, r, 0.0).square().sum())
    return math.sqrt(num / den) if den > 0 else None
