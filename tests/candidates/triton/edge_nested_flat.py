"""For the task returning (relu(x + y), (relu(y + x), relu(x + y))): honest, the three outputs flat. Must be correct."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y), relu_add(y, x), relu_add(x, y)
