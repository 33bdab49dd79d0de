"""Honest compute, but leaves a thread running after forward returns, started with the low-level
_thread module (which threading.enumerate does not list). Must break the rules."""

import time, _thread  # noqa: E401


import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        _thread.start_new_thread(time.sleep, (3600,))
        return relu_add(x, y)
