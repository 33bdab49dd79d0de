"""Refused by rule: the C++ kernel splits the work over two std::threads and joins them before
returning. The cpp skill allows threads through OpenMP only (a thread of the kernel's own could
just as well outlive the call), so the source rules refuse it and say to use OpenMP."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp threads_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.relu_add_threads(x.contiguous(), y.contiguous())
