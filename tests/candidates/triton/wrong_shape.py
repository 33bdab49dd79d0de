"""Wrong shape: the right values, viewed as 128 x 128 instead of 16384. Must be incorrect (shape)."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y).view(128, -1)
