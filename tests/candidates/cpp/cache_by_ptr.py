"""C++ cache keyed by the inputs' addresses: a reused address replays an old answer. Must be rejected."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp misc_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.cache_by_ptr(x, y)
