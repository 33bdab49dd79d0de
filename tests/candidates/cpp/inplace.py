"""The C++ kernel writes the answer into input x and returns x. Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp misc_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.inplace(x, y)
