"""Class: reaching the harness's objects (here the worker, through gc) to move what a candidate is
compared with. Every call through the worker's own code path is made 20 ms slower. Were any time
taken out of the candidate's measured in its own process after it was loaded (an empty call's round
trip, say), that would take 20 ms off every call. The candidate is compared with the task's Model
timed through this worker before any candidate code existed in it (the yardstick), so the 20 ms land
in its own time, and the yardstick is what it was. Must be correct and timed honestly (slow)."""

import gc
import sys
import time

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_call = _worker.ops.call


def _slow(worker, go, fds):
    time.sleep(0.02)
    return _call(worker, go, fds)


_worker.ops = _worker.ops._replace(call=_slow)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
