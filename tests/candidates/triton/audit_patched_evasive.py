"""Disarms the auditor as audit_patched.py does, reaching the harness's guards module without
spelling the module table's name. Must break the rules."""

import sys

import torch
import torch.nn as nn

from kernels.relu_add import noop

_guards = getattr(sys, "mod" "ules")["guards"]
_guards.TorchComputeAudit.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.relu(x + y)
        noop(out)
        return out
