"""Class: reaching the harness's objects to change what the judge reads. The worker's reply gives,
as the call's output, the previous call's correct answer (kept in the worker): no work at all. The judge compares what it reads with the reference for this call's fresh
inputs: wrong. Must be incorrect."""

import gc
import sys

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_call = _worker.ops.call
_last = []


def _replay(worker, go, fds):
    if not _last:
        done = _call(worker, go, fds)
        _last.append(worker.kept[-1].clone())  # this call's answer, for every later call
        return done
    model, worker.model = worker.model, (lambda *inputs: _last[-1])  # the previous call's answer, as this one's
    try:
        return _call(worker, go, fds)
    finally:
        worker.model = model


_worker.ops = _worker.ops._replace(call=_replay)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
