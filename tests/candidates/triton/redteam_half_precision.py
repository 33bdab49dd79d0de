"""Computes relu(x + y) in float16 on a float32 task (tensor-core math's rounding, in one kernel): its
answer passes the 1e-2 tolerance, at a precision the task does not have. Must be refused by the
precision contract (reward -1, "less precise than the task's dtype"), on the first trial already."""

import torch.nn as nn

from kernels.relu_add import half_relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        return half_relu_add(x, y)
