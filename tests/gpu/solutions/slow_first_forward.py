"""Honest, and its first forward is slow, as a Triton autotuner's or a large kernel's compile is
(here a 2 s sleep): that first forward runs in the worker's load, on inputs of its own, so no call
of the judge's (each holds the calls lock that every other job's timing run waits for) takes it.
Correct."""

import time

import torch
import torch.nn as nn
import triton
import triton.language as tl

FIRST_FORWARD_S = 2.0  # tests/gpu/test_gpu_evaluation.py reads this figure


@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(v < 0, 0.0, v), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        if self.calls == 0:
            time.sleep(FIRST_FORWARD_S)
        self.calls += 1
        out = torch.empty_like(x)
        kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096, num_warps=8)
        return out
