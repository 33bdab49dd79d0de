"""relu(x + y) with one fused Triton kernel: each input is read once, the output written once."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    v = x + y
    tl.store(out_ptr + offsets, tl.where(v < 0, 0.0, v), mask=mask)  # NaN stays NaN, as in torch.relu


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        # 4096 elements (16 KiB per input) per program on the GPU; under the CPU interpreter
        # (TRITON_INTERPRET=1) every program is a Python-level step, so use far fewer.
        block = 4096 if x.is_cuda else 1 << 18
        relu_add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block, num_warps=8)
        return out
