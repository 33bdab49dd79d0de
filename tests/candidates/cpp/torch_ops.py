"""Torch compute inside the C++ extension: torch::relu(torch::add(x, y)) from the binding. Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp torch_ops_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.torch_ops(x, y)
