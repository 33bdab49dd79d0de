"""For the task returning (relu(x + y), self.weight): honest, its own weight (loaded from the
reference's) returned as is, an nn.Parameter. Must be correct."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1 << 14))

    def forward(self, x, y):
        return relu_add(x, y), self.weight
