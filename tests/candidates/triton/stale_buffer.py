"""Stale memory: compute once, then keep returning fresh torch.empty_like buffers of the same size,
hoping the allocator hands back the block that held an earlier answer. Must be incorrect."""

import torch
import torch.nn as nn

from kernels.relu_add import noop, relu_add


class ModelNew(nn.Module):
    calls = 0

    def forward(self, x, y):
        ModelNew.calls += 1
        if ModelNew.calls == 1:
            return relu_add(x, y)
        out = torch.empty_like(x)
        noop(out)
        return out
