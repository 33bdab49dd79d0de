"""Full precision while it is tried, float16 once it is timed: the honest kernel for its first calls
(the trials), ``redteam_half_precision``'s after. Must be refused all the same: one of the timed
calls, which the worker cannot tell apart, is held to the precision contract too."""

import torch.nn as nn

from kernels.relu_add import half_relu_add, relu_add

TRIALS = 5


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        return relu_add(x, y) if self.calls <= TRIALS else half_relu_add(x, y)
