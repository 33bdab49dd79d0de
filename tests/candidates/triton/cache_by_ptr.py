"""Caches results keyed by the inputs' data_ptr: a reused address replays an old answer. Must be rejected
(a wrong trial, or a timed call whose output is wrong)."""

import torch.nn as nn

from kernels.relu_add import noop, relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x, y):
        key = (x.data_ptr(), y.data_ptr())
        if key in self.cache:
            out = self.cache[key].clone()
            noop(out)
            return out
        out = relu_add(x, y)
        self.cache[key] = out.clone()
        return out
