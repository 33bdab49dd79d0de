"""Returns an empty plain tensor and shadows Tensor.to and Tensor.reshape (methods of torch's C base
class, set on torch.Tensor through an alias) so that the harness's own reads of the output compute
relu(x + y) with torch, after the audit and after the end mark. Must be rejected by the integrity
check (a new attribute of torch.Tensor hiding its base class's)."""

import torch
import torch.nn as nn

from kernels.relu_add import noop

T = torch.Tensor
_to, _reshape = T.to, T.reshape
pending = {}


def _answer(t):
    job = pending.pop(t.data_ptr(), None) if t.numel() else None
    if job is None or job[1].shape != t.shape:
        return None
    _, x, y = job
    return torch.relu(x + y)


def lazy_to(self, *args, **kwargs):
    r = _answer(self)
    return _to(self if r is None else r, *args, **kwargs)


def lazy_reshape(self, *args):
    r = _answer(self)
    return _reshape(self if r is None else r, *args)


T.to = lazy_to
T.reshape = lazy_reshape


class ModelNew(nn.Module):
    def forward(self, x, y):
        pending.clear()
        out = torch.empty_like(x)
        noop(out)
        pending[out.data_ptr()] = (out, x, y)
        return out
