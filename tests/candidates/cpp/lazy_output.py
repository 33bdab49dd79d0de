"""Work done outside the timed region, for a kernel of any size: after the 5 trials and 3 warm-ups,
forward returns a tensor subclass that holds only the inputs (and is honest on the harness's audited
extra calls, recognised because their inputs repeat the previous call's). Nothing checks the type of
a timed call's output; the first thing that reads it (once, the harness's fingerprint after the end mark; now the worker's
share of its outputs, before it says done) runs the real, slow kernel (slow_honest.py's).
The old marks and the parent's bracket both saw a call of microseconds. Must be rejected, or timed
honestly (about slow_honest.py's time)."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp misc_fixture.h

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

import cuda_extension


def _slow_kernel(x, y):
    return cuda_extension.relu_add_slow(x.contiguous(), y.contiguous(), 150)


class Deferred(torch.Tensor):
    @staticmethod
    def __new__(cls, x, y):
        self = torch.Tensor._make_wrapper_subclass(cls, x.shape, dtype=x.dtype, device=x.device)
        self.inputs, self.value = (x, y), None
        return self

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def force(a):
            if isinstance(a, Deferred):
                if a.value is None:
                    a.value = _slow_kernel(*a.inputs)
                return a.value
            return a

        return func(*tree_map(force, args), **tree_map(force, kwargs or {}))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls, self.last = 0, None

    def forward(self, x, y):
        self.calls += 1
        key = (x[0].item(), x[-1].item(), y[0].item(), y[-1].item())
        repeat, self.last = key == self.last, key
        if self.calls <= 8 or repeat:  # trials, warm-ups, and audited extra calls (their inputs repeat)
            return _slow_kernel(x, y)
        return Deferred(x, y)
