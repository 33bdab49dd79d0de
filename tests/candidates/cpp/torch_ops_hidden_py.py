"""Torch compute inside the C++ extension through the dispatcher with only DispatchKey::Python
excluded, so the harness's dispatch-mode audit does not see it. Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp torch_hidden_py_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.torch_ops_hidden_py(x, y)
