"""For the task returning (relu(x + y), self.table[:16]): honest, the slice copied by a kernel of
its own. Must be correct, timed runs included (the reference's buffer must still hold its values
when the reference's outputs are taken, after its baselines were timed)."""

import torch
import torch.nn as nn

from kernels.relu_add import copy, relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.empty(64))

    def forward(self, x, y):
        return relu_add(x, y), copy(self.table[:16])
