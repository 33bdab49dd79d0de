"""Half a kernel: Triton does relu(x + 0) while torch does the add. Must break the rules."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x + y, torch.zeros_like(y))
