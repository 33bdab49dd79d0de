"""Torch compute inside the C++ extension calling ATen's CPU kernels directly (at::cpu::add,
at::cpu::clamp_min): no dispatcher, so no dispatch mode sees it. Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp torch_ops_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.torch_ops_direct(x, y)
