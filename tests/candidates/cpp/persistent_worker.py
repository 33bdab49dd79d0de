"""The trials computed at once; in the timing run forward returns at once and a persistent native
worker (past the thread watch, which sees Python threads) fills the output 1 ms later, while the
harness does its own work after the end mark. The source rules refuse the thread; past them, the
output of a timed call is read as soon as the call has ended, so this must be rejected."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp persistent_worker_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.persistent_worker(x.contiguous(), y.contiguous(), 1000)
