"""Honest: one fused Triton kernel. Must be correct, reward >= 1, no violations."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
