"""Returns at once; a detached std::jthread fills the output 5 ms later. Must be rejected."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp deferred_jthread_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.deferred_jthread(x, y, 5000)
