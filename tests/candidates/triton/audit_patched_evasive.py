"""Disarms the auditor as audit_patched.py does, reaching the harness's guards module through
`from sys import modules`. Must break the rules."""

import torch
import torch.nn as nn
from sys import modules as _loaded

from kernels.relu_add import noop

_guards = _loaded["guards"]
_guards.TorchComputeAudit.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.relu(x + y)
        noop(out)
        return out
