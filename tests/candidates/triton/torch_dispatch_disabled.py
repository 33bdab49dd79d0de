"""Torch compute under torch._C._DisableTorchDispatch (skips Python dispatch). Must break the rules."""

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        with torch._C._DisableTorchDispatch():
            out = torch.relu(x + y)
        noop(out)
        return out
