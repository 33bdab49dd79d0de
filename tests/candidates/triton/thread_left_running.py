"""Honest compute, but leaves a Python thread running after forward returns. Must break the rules."""

import threading
import time

import torch.nn as nn

from kernels.relu_add import relu_add

_stop = threading.Event()


class ModelNew(nn.Module):
    def forward(self, x, y):
        threading.Thread(target=_stop.wait, args=(3600,), daemon=True, name="lingering-worker").start()
        return relu_add(x, y)
