"""Work done outside the timed region, for a kernel of any size: after the 5 trials and 3 warm-ups,
forward returns a tensor subclass that holds only the inputs. Nothing checks the type of a timed
call's output; the first thing that reads it (the harness's fingerprint, after the end mark and
after the end-of-call signal the parent brackets) runs the real kernel. The marks and the parent's
bracket both see a call that took microseconds. Must be rejected, or timed honestly (about the
honest kernel's time)."""

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

from kernels.relu_add import relu_add


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
                    a.value = relu_add(*a.inputs)
                return a.value
            return a

        return func(*tree_map(force, args), **tree_map(force, kwargs or {}))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls <= 8:
            return relu_add(x, y)
        return Deferred(x, y)
