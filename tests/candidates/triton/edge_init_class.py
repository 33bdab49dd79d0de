"""For the task whose get_init_inputs() returns a class (nn.ReLU): honest. Must be correct."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def forward(self, x, y):
        return relu_add(x, y)
