"""Honest: the fused C++ kernel (cuda_extension.relu_add). Must be correct, reward >= 1, no violations."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp misc_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.relu_add(x.contiguous(), y.contiguous())
