"""Tells checked calls from timed ones by the auditor's dispatch mode: honest while a mode is active
(the correctness trials), a cheap replay of the last answer otherwise (warm-up and timed calls). Must be rejected."""

import torch.nn as nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kernels.relu_add import noop, relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = None

    def forward(self, x, y):
        if _get_current_dispatch_mode() is not None or self.last is None:
            out = relu_add(x, y)
            self.last = out.clone()
            return out
        out = self.last.clone()
        noop(out)
        return out
