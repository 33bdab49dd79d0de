"""For the task returning (relu(x + y), (relu(y + x), relu(x + y))): honest, the same nesting. Must be correct."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = relu_add(x, y)
        return out, (relu_add(y, x), relu_add(x, y))
