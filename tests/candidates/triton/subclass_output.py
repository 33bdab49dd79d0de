"""Returns a torch.Tensor subclass (whose comparisons could be rigged) holding the right values.
Must be rejected."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class Agreeable(torch.Tensor):
    def __eq__(self, other):
        return True

    def allclose(self, *args, **kwargs):
        return True


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y).as_subclass(Agreeable)
