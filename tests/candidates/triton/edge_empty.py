"""For the task on empty inputs: honest, nothing to compute, so no kernel is launched. Must be correct."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        if x.numel() == 0:
            return torch.empty_like(x)
        return relu_add(x, y)
