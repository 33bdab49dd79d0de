"""Torch compute inside the C++ extension calling ATen's CPU kernels directly (add, clamp_min) past
the dispatcher, through a namespace alias. Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp torch_alias_direct_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.torch_ops_aliased_direct(x, y)
