"""Wrong dtype: the right values stored as float64. Must be incorrect (dtype)."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y, out=torch.empty(x.shape, dtype=torch.float64))
