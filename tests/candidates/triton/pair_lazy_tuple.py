"""For the two-output task: forward launches a kernel as its alibi and returns a tuple subclass
holding the inputs, whose __iter__ computes the outputs with torch when the harness reads them
(after the audit has ended, and after a timed call's end mark). Must be rejected: the harness reads
the tuple's own items."""

import torch
import torch.nn as nn

from kernels.relu_add import noop


class Deferred(tuple):
    def __iter__(self):
        x, y = tuple.__getitem__(self, 0), tuple.__getitem__(self, 1)
        return iter((torch.relu(x + y), torch.relu(y + x)))

    def __getitem__(self, index):
        return list(self)[index]


class ModelNew(nn.Module):
    def forward(self, x, y):
        noop(x)
        return Deferred((x, y))
