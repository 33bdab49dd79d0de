"""Wrong answer: x * y instead of relu(x + y), in a real Triton kernel. Must be incorrect."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * tl.load(y_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        mul_kernel[(triton.cdiv(x.numel(), 1 << 14),)](x, y, out, x.numel(), BLOCK=1 << 14)
        return out
