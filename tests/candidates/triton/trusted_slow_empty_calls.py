"""Class: reaching the harness's objects (here the worker, through gc) to buy time. Every call the
judge calibrates its round trip with is made slow (20 ms more, in the worker's own code path), so
that the judge, taking that round trip out of each timed call, would take out 20 ms the candidate
never spent. The judge calibrates before any candidate code exists in the worker and never takes
out more than that: the honest kernel's time, not less. Must be correct and timed honestly."""

import gc
import sys
import time

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_call = _worker.ops.call


def _slow_when_empty(worker, go):
    if go.null:
        time.sleep(0.02)
    return _call(worker, go)


_worker.ops = _worker.ops._replace(call=_slow_when_empty)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
