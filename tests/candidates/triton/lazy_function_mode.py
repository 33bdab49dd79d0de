"""Class: a torch function mode left on the stack (pushed through its public base class, no
reflection). forward returns an empty tensor; the mode computes the real output the first time the
harness touches that tensor, after forward has returned. The worker copies or names its outputs
before it answers the judge, so whatever the mode computes then is inside the judge's clock, and a
mode left on the stack after a call is a violation. Must be rejected (or timed honestly)."""

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from kernels.relu_add import noop, relu_add

_pending = {}


class _Lazy(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in list(args) + list(kwargs.values()):
            if isinstance(t, torch.Tensor) and id(t) in _pending:
                x, y = _pending.pop(id(t))
                relu_add(x, y, t)  # the mode is off while its handler runs: no recursion
        return func(*args, **kwargs)


_Lazy().__enter__()


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        _pending[id(out)] = (x, y)
        return out
