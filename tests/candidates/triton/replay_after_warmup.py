"""Honest for the first 8 calls (5 trials + 3 warm-ups), then replays a copy of the last answer. Must be rejected."""

import torch.nn as nn

from kernels.relu_add import noop, relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls, self.last = 0, None

    def forward(self, x, y):
        self.calls += 1
        if self.calls <= 8 or self.last is None:
            out = relu_add(x, y)
            self.last = out.clone()
            return out
        out = self.last.clone()
        noop(out)
        return out
