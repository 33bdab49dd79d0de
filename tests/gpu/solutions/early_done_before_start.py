"""The early_done attack with the done word written before the call starts: on a side stream that
waits for nothing, so the judge's stream finds the call done as soon as it looks. Forward reaches the
worker (through gc) and the call's number (from the worker's frame), and computes the output on a side stream that first spins for
about a millisecond. The judge snapshots the outputs once the done word holds the number: either the
output is not there yet (wrong), or the spin and the kernel ran before the snapshot and are in the
time. Never correct and faster than its work."""

import gc
import sys

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


def _worker():
    return next(o for o in gc.get_objects() if isinstance(o, sys.modules["worker"].Worker))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()
        self.worker = _worker()

    def forward(self, x, y):
        out = torch.empty_like(x)
        frame = sys._getframe(1)
        while "go" not in frame.f_locals:
            frame = frame.f_back
        self.worker.flags[0].done(self.side, frame.f_locals["go"].k)  # "done", before the call starts
        self.side.wait_stream(torch.cuda.current_stream())  # the inputs are there once the call starts
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(2_000_000)  # about a millisecond
            kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096, num_warps=8)
        return out
