"""For the two-output task (relu(x + y), relu(y + x)), honest: a plain tuple of two kernel outputs.
Must be correct."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y), relu_add(y, x)
