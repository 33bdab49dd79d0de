"""Honest, but its forward waits for its own device work on the host (a value read back with
.item() to choose a launch): the worker cannot queue the whole call before it starts, so the judge
opens the gate without waiting for it, and the host's share of the call is timed. Correct."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(v < 0, 0.0, v), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        block = 4096 if x[0].item() is not None else 1024  # a host read of an input: waits for the call to start
        kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block, num_warps=8)
        return out
