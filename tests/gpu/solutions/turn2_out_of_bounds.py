import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + 1_000_000_000  # no mask, far out of bounds
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0))


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out
