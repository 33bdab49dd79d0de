"""Returns a view of an input: the kernel writes the answer into y, forward returns y[:] (a view). Must break the rules."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        relu_add(x, y, out=y)
        return y[:]
