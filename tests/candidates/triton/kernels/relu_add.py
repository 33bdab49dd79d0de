"""The honest fused relu(x + y) Triton kernel shared by the candidate fixtures."""

import torch
import triton
import triton.language as tl


@triton.jit
def relu_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    v = x + y
    tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v), mask=mask)


@triton.jit
def noop_kernel(out_ptr, n, BLOCK: tl.constexpr):
    """Launches and does nothing useful: a cheater's alibi for 'a Triton kernel ran'."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < 1
    tl.load(out_ptr + offsets, mask=mask)


BLOCK = 1 << 14


def relu_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    relu_add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)
    return out


def noop(t: torch.Tensor) -> None:
    noop_kernel[(1,)](t, t.numel(), BLOCK=16)


@triton.jit
def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def copy(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    out = torch.empty_like(t)
    copy_kernel[(triton.cdiv(t.numel(), BLOCK),)](t, out, t.numel(), BLOCK=BLOCK)
    return out


@triton.jit
def half_relu_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """relu(x + y) computed in float16 (the rounding of tensor-core math), stored as float32."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float16)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float16)
    v = x + y
    tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v).to(tl.float32), mask=mask)


def half_relu_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    half_relu_add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
    return out
