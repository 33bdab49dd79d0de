"""x * y + x in one Triton kernel that computes in float32 and rounds once to bfloat16: honest,
and more accurate than eager, which rounds x * y first. `WRONG = True` forgets the `+ x`."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

WRONG = False


@triton.jit
def fused_kernel(x_ptr, y_ptr, out_ptr, n, ADD: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    v = x * y + x if ADD else x * y
    tl.store(out_ptr + offsets, v.to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        block = 4096 if x.is_cuda else 1 << 16
        fused_kernel[(triton.cdiv(n, block),)](x, y, out, n, ADD=not WRONG, BLOCK=block)
        return out
