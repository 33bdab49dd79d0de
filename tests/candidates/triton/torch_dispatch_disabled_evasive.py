"""Torch compute under torch._C._DisableTorchDispatch, with torch's C module imported by name
(`from torch import _C`). Must break the rules."""

import torch
import torch.nn as nn
from torch import _C as _native

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        with _native._DisableTorchDispatch():
            out = torch.relu(x + y)
        noop(out)
        return out
