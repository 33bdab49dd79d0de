"""The binary is not the source: the module was built from torch_ops.inc (torch compute
inside C++), then kernels/ was edited so that only innocent sources remain (the broker snapshots
whatever build/cuda_extension*.so is there and only notes a stale build). Static source rules read
the innocent text; the run-time audit must still catch the torch compute the binary does.
Must break the rules."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp misc_fixture.h
# module: misc_fixture.h torch_ops_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.torch_ops(x, y)
