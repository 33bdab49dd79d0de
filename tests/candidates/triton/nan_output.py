"""NaN output: the right values except one NaN (the reference is finite everywhere). Must be incorrect."""

import torch.nn as nn
import triton
import triton.language as tl

from kernels.relu_add import relu_add


@triton.jit
def poke_nan(out_ptr, index):
    tl.store(out_ptr + index, float("nan"))


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = relu_add(x, y)
        poke_nan[(1,)](out, 1234)
        return out
