"""Output comparison for the correctness check (trusted side only: never imported by candidates).

The KernelBench rule with no loopholes: same structure, same shape, same dtype, and every
element within atol + rtol * |ref|; a NaN or Inf in the candidate must be matched by the
same value at the same place in the reference, and a NaN never passes where the reference
is finite.

The judge runs it (``judge.py`` imports it as a sibling module), on the device that holds the
reference's outputs; its report is ``protocol.TrialVerdict``, which the harness turns into the
result's ``records.TrialReport`` (the same fields).
"""

from __future__ import annotations

import torch

if __package__:
    from .protocol import TrialVerdict as TrialReport
else:  # an evaluation child: the siblings are top-level modules there
    from protocol import TrialVerdict as TrialReport


def flatten_outputs(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def compare_outputs(trial: int, reference, candidate, atol: float, rtol: float) -> TrialReport:
    if isinstance(reference, (list, tuple)) != isinstance(candidate, (list, tuple)):
        want = "a tuple/list of outputs" if isinstance(reference, (list, tuple)) else "a single tensor"
        return TrialReport(trial=trial, correct=False, message=f"returned a {type(candidate).__name__}, expected {want}")
    refs, cands = flatten_outputs(reference), flatten_outputs(candidate)
    if len(refs) != len(cands):
        return TrialReport(trial=trial, correct=False, message=f"returned {len(cands)} outputs, expected {len(refs)}")
    max_abs = max_rel = 0.0
    for index, (ref, cand) in enumerate(zip(refs, cands)):
        label = f"output {index}" if len(refs) > 1 else "output"
        if not isinstance(cand, torch.Tensor):
            return TrialReport(trial=trial, correct=False, message=f"{label} is a {type(cand).__name__}, not a tensor")
        if type(cand) is not torch.Tensor and not isinstance(cand, torch.nn.Parameter):
            return TrialReport(trial=trial, correct=False, message=f"{label} is a tensor subclass ({type(cand).__name__}); return a plain tensor")
        if tuple(cand.shape) != tuple(ref.shape):
            return TrialReport(trial=trial, correct=False, message=f"{label} has shape {tuple(cand.shape)}, expected {tuple(ref.shape)}")
        if cand.dtype != ref.dtype:
            return TrialReport(trial=trial, correct=False, message=f"{label} has dtype {cand.dtype}, expected {ref.dtype}")
        report = _compare_tensor(trial, label, ref.detach(), cand.detach(), atol, rtol)
        if not report.correct:
            return report
        max_abs = max(max_abs, report.max_abs_error or 0.0)
        max_rel = max(max_rel, report.max_rel_error or 0.0)
    return TrialReport(trial=trial, correct=True, max_abs_error=max_abs, max_rel_error=max_rel)


#: Elements per chunk of a comparison: its work tensors (float64 at most) stay a quarter of a GB
#: however large the output. A judge short of device memory for a full-size float32 copy of each
#: side (a KernelBench level-1 output is 6 GiB) would fail where the candidate is right.
_CHUNK = 1 << 25


def _compare_tensor(trial: int, label: str, ref: torch.Tensor, cand: torch.Tensor, atol: float, rtol: float) -> TrialReport:
    """Chunk by chunk, in row-major order whatever the two tensors' strides, each chunk of the
    reference brought to the candidate's device: the judge keeps a trial's reference outputs in
    host memory when the device was short as the trial ran, and the candidate's are on the device."""
    exact = ref.is_complex() or not ref.is_floating_point()
    ref_flat, cand_flat = ref.reshape(-1), cand.reshape(-1)
    max_abs = max_rel = 0.0
    n_bad, first, nan_where_finite = 0, None, 0
    for start in range(0, ref_flat.numel(), _CHUNK):
        r, c = ref_flat[start:start + _CHUNK].to(cand.device), cand_flat[start:start + _CHUNK]
        if exact:
            if not torch.equal(r, c):
                bad = (r != c).nonzero()
                n_bad += len(bad)
                if first is None:
                    first = start + int(bad[0])
            continue
        passed = _all_close(r, c, atol, rtol)
        if passed is not None:
            max_abs, max_rel = max(max_abs, passed[0]), max(max_rel, passed[1])
            continue
        r64, c64 = r.double(), c.double()
        r_nan, c_nan = r64.isnan(), c64.isnan()
        r_fin = r64.isfinite()
        both_finite = r_fin & c64.isfinite()
        diff = torch.zeros_like(r64)
        diff[both_finite] = (r64[both_finite] - c64[both_finite]).abs()
        close = both_finite & (diff <= atol + rtol * r64.abs())
        # Non-finite values pass only where the reference has the very same value.
        same_special = (r_nan & c_nan) | (~r_fin & ~r_nan & (r64 == c64))
        bad = (~(close | same_special)).nonzero()
        finite_diff = diff[both_finite]
        if finite_diff.numel():
            max_abs = max(max_abs, float(finite_diff.max()))
            max_rel = max(max_rel, float((finite_diff / r64[both_finite].abs().clamp_min(1e-12)).max()))
        nan_where_finite += int((c_nan & ~r_nan).sum())
        n_bad += len(bad)
        if len(bad) and first is None:
            first = start + int(bad[0])
    if not n_bad:
        return TrialReport(trial=trial, correct=True, max_abs_error=max_abs, max_rel_error=max_rel)
    at = _unravel(first, tuple(ref.shape))
    if exact:
        return TrialReport(trial=trial, correct=False, first_bad_index=at,
                           message=f"{label}: {n_bad} elements differ (exact match required for {ref.dtype})")
    got, expected = float(cand_flat[first].double()), float(ref_flat[first].double())
    extra = f"; {nan_where_finite} NaN where the reference is not NaN" if nan_where_finite else ""
    return TrialReport(
        trial=trial, correct=False, max_abs_error=max_abs, max_rel_error=max_rel, first_bad_index=at,
        message=(f"{label}: {n_bad} of {ref.numel()} elements outside atol={atol:g}, rtol={rtol:g}; "
                 f"max abs error {max_abs:.4g}, max rel error {max_rel:.4g}; first bad index {at}: "
                 f"got {got:.6g}, expected {expected:.6g}{extra}"),
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index in ``shape`` of the ``flat``-th element in row-major order."""
    index = []
    for size in reversed(shape):
        flat, position = divmod(flat, size)
        index.append(position)
    return index[::-1]


def _all_close(ref: torch.Tensor, cand: torch.Tensor, atol: float, rtol: float) -> tuple[float, float] | None:
    """(max abs error, max rel error) when every element is finite in the reference and within
    tolerance, else None (the full check above then says what is wrong, and where). The common
    case in a few in-place passes and no masked copies: a 64M-element output is checked in a
    fraction of the full check's time. A NaN or Inf in the candidate makes the difference NaN or
    Inf, which no finite tolerance admits.

    Outputs of 32 bits or fewer are checked in float32 (every such value converts exactly),
    against a tolerance tightened by a factor of 1 - 2^-20: the difference and the tolerance are
    each a few float32 roundings (at most 2^-24 each) from their exact values, so an element
    that passes here is within the exact tolerance. One that does not (or an output that is near
    the tolerance everywhere) goes to the full float64 check, which decides."""
    if ref.dtype == torch.float64:
        work, margin = torch.float64, 1.0
    else:
        work, margin = torch.float32, 1.0 - 2.0 ** -20
    ref_abs = ref.to(work, copy=True)  # copies: .to() of a tensor already of that dtype is the tensor itself
    diff = cand.to(work, copy=True).sub_(ref_abs).abs_()
    ref_abs.abs_()
    within = diff <= ref_abs.mul(rtol * margin).add_(atol * margin)
    if not bool(within.logical_and_(ref.isfinite()).all()):
        return None
    if diff.numel() == 0:
        return 0.0, 0.0
    return float(diff.max()), float(diff.div_(ref_abs.clamp_min_(1e-12)).max())
