"""Honest: the C++ kernel splits the work over two std::threads and joins them before returning
(the skill allows the C++ standard library and forbids only threads that outlive the call).
Must be correct, no violations."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp threads_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.relu_add_threads(x.contiguous(), y.contiguous())
