"""Defers the work to a background thread (started with the low-level _thread module): forward returns
an empty output at once, the thread fills it 20 ms later. Must be rejected (the output is read before
it is filled)."""

import _thread
import time

import torch
import torch.nn as nn

from kernels.relu_add import noop, relu_add


def _fill_later(x, y, out):
    time.sleep(0.02)
    relu_add(x, y, out=out)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        _thread.start_new_thread(_fill_later, (x, y, out))
        return out
