"""Mutates an input: the kernel writes relu(x + y) into x and returns x. Must break the rules."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y, out=x)
