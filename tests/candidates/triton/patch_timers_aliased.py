"""Patches the timers at import as patch_timers.py does, through aliases (so no text rule about
`time.x = ...` sees it): time.perf_counter, time.perf_counter_ns and torch.cuda.Event. The run-time
integrity check must report it."""

import time as _clock

import torch as _t
import torch.nn as nn

from kernels.relu_add import relu_add

_frozen = _clock.perf_counter_ns()
_clock.perf_counter = lambda: _frozen / 1e9
_clock.perf_counter_ns = lambda: _frozen
_t.cuda.Event = object


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
