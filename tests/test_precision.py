"""The precision contract (evaluators/child/precision.py): a task's dtype is the precision its answer must
have. Honest ways of computing the task's answer at its dtype (another summation order, fused steps, a
more precise intermediate) pass; the same answer computed with a lower precision's rounding (float16,
bfloat16 or TF32 operands) is refused, though it passes the tolerance. Each case is the task's Model
against a candidate function, on the CPU, as the judge measures them (``Contract.measure``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernel_env.evaluators.child import precision


class Matmul(nn.Module):
    def forward(self, a, b):
        return a @ b


class Gelu(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class RowSum(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(1024)

    def forward(self, x):
        return self.norm(x)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)

    def forward(self, x):
        return self.conv(x)


class FusedHalf(nn.Module):
    def forward(self, x, y):
        return x * y + x


def _measure(model: nn.Module, inputs: list, candidate, task: dict | None = None) -> precision.Measure:
    contract = precision.Contract(model, task or {})
    with torch.no_grad():
        eager, got = model(*inputs), candidate(*inputs)
    return contract.measure(inputs, [eager], [got])


def _inputs(name: str) -> list:
    torch.manual_seed(0)
    return {
        "matmul": lambda: [torch.randn(128, 2048) / 45, torch.randn(2048, 128)],  # outputs of about 1
        "gelu": lambda: [torch.randn(1 << 18)],
        "rowsum": lambda: [torch.rand(8, 1 << 16)],
        "norm": lambda: [torch.randn(256, 1024) * 3 + 5],
        "conv": lambda: [torch.randn(4, 8, 32, 32)],
        "half": lambda: [torch.randn(1 << 16).bfloat16(), torch.randn(1 << 16).bfloat16()],
    }[name]()


def _sequential_matmul(a, b):
    """Another summation order: the K products accumulated one at a time (a naive kernel's loop)."""
    out = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        out += a[:, k:k + 1] * b[k:k + 1, :]
    return out


def _naive_layernorm(model: Norm):
    def run(x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean  # one pass, E[x^2] - E[x]^2
        return (x - mean) / torch.sqrt(var + model.norm.eps) * model.norm.weight + model.norm.bias
    return run


def _tf32(t: torch.Tensor) -> torch.Tensor:
    return precision.rounded(t, 10)


def test_honest_ways_of_computing_at_the_tasks_dtype_are_never_refused():
    conv = Conv()
    norm = Norm()
    cases = {
        "matmul, another summation order": (Matmul(), "matmul", _sequential_matmul),
        "gelu through erf's identity": (Gelu(), "gelu", lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))),
        "layernorm in one pass": (norm, "norm", _naive_layernorm(norm)),
        "conv as unfold and matmul": (conv, "conv", lambda x: (conv.conv.weight.flatten(1) @ F.unfold(x, 3)).view(4, 16, 30, 30)
                                      + conv.conv.bias.view(1, -1, 1, 1)),
        "bfloat16 computed in float32, rounded once": (FusedHalf(), "half",
                                                       lambda x, y: (x.float() * y.float() + x.float()).bfloat16()),
    }
    for name, (model, inputs, candidate) in cases.items():
        found = _measure(model, _inputs(inputs), candidate)
        assert not found.refused, f"{name}: {found}"
        assert found.limit is not None and found.error < found.limit / 4, f"{name}: too near its limit: {found}"


@pytest.mark.parametrize("name,model,inputs,candidate", [
    ("matmul on TF32 operands", Matmul(), "matmul", lambda a, b: _tf32(a) @ _tf32(b)),
    ("matmul in float16, float32 accumulation", Matmul(), "matmul", lambda a, b: a.half().float() @ b.half().float()),
    ("matmul in bfloat16", Matmul(), "matmul", lambda a, b: (a.bfloat16() @ b.bfloat16()).float()),
    ("gelu in float16", Gelu(), "gelu", lambda x: F.gelu(x.half()).float()),
    ("gelu's tanh approximation", Gelu(), "gelu", lambda x: F.gelu(x, approximate="tanh")),
])
def test_an_answer_at_a_lower_precision_is_refused_though_within_the_tolerance(name, model, inputs, candidate):
    args = _inputs(inputs)
    with torch.no_grad():
        assert torch.allclose(candidate(*args), model(*args), atol=1e-2, rtol=1e-2), "not within the tolerance: no test"
    found = _measure(model, args, candidate)
    assert found.refused, f"{name}: {found}"
    assert found.error > found.limit > found.eager_error
    assert "less precise than the task's dtype" in found.message(1) and "input_precision" in found.message(1)


def test_where_rounding_averages_out_a_naive_summation_order_is_not_refused():
    """Sums of same-sign terms (a matmul of torch.rand operands): rounding the operands to 10 bits shows no
    more error than an honest float32 loop summing the K terms one at a time, which must pass."""
    torch.manual_seed(0)
    for k in (1024, 4096, 16384):
        a, b = torch.rand(64, k), torch.rand(k, 64)
        found = _measure(Matmul(), [a, b], _sequential_matmul)
        # Less precise than eager's blocked sum (3.7x at K = 1024 in one run, over 4x in another: eager's
        # blocking follows torch's thread count), and paid.
        assert not found.refused and found.error > 2 * found.eager_error, (k, found)
    found = _measure(RowSum(), _inputs("rowsum"), lambda x: x.half().float().sum(dim=1))
    assert not found.refused, found


def test_where_rounding_averages_out_an_output_at_a_lower_precision_is_refused():
    found = _measure(RowSum(), _inputs("rowsum"), lambda x: x.sum(dim=1).bfloat16().float())
    assert found.refused and found.limit == 2.0 ** -12, found


def test_a_task_may_accept_lower_precision():
    found = _measure(Matmul(), _inputs("matmul"), lambda a, b: _tf32(a) @ _tf32(b), task={"LOWER_PRECISION": True})
    assert not found.refused and "LOWER_PRECISION" in found.note


def test_a_model_that_does_not_run_in_float64_is_not_checked_and_says_why():
    class Float32Only(nn.Module):
        def forward(self, a, b):
            return a @ b.float()

    found = _measure(Float32Only(), _inputs("matmul"), lambda a, b: _tf32(a) @ _tf32(b))
    assert not found.refused and "does not run in float64" in found.note


def test_rounding_keeps_the_bits_asked_and_leaves_what_is_not_finite():
    x = torch.tensor([1.0 + 2 ** -12, 1.0 + 2 ** -9, -3.0000002, float("inf"), float("nan"), 0.0])
    got = precision.rounded(x, 10)
    assert got[0] == 1.0 and got[1] == 1.0 + 2 ** -9 and got[2] == -3.0 and got[3] == float("inf")
    assert torch.isnan(got[4]) and got[5] == 0.0
    assert precision.rounded(torch.tensor([1.3], dtype=torch.bfloat16), 2).item() == 1.25


def test_a_call_with_no_room_for_the_float64_run_is_not_checked_and_the_next_one_is(monkeypatch):
    """Memory pressure (the candidate's own allocations, or a neighbour's) skips one call's check, says so,
    and leaves the contract in force for the calls after it."""
    contract = precision.Contract(Matmul(), {})
    args = _inputs("matmul")
    real = precision.Contract._measure
    calls = []

    def short_once(self, *rest):
        calls.append(rest[-1])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("no room")
        return real(self, *rest)

    monkeypatch.setattr(precision.Contract, "_measure", short_once)
    with torch.no_grad():
        eager, got = Matmul()(*args), _tf32(args[0]) @ _tf32(args[1])
    first = contract.measure(args, [eager], [got])
    assert not first.refused and "no room" in first.note, first
    assert contract.measure(args, [eager], [got]).refused
