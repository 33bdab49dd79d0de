"""Class: reaching the harness's objects to change what the judge reads. The worker's reply names,
as the call's output, memory that holds the previous call's correct answer (kept in the worker) or
an input: no work at all. The judge compares what it reads with the reference for this call's fresh
inputs: wrong. Must be incorrect."""

import gc
import sys

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_call = _worker.ops.call
_last = []


def _replay(worker, go):
    if not _last:
        done = _call(worker, go)
        _last.append(worker.layouts[go.layout].spill[0].clone())  # this call's answer, for the next call
        return done
    spill = worker.layouts[go.layout].spill[0]
    spill.copy_(_last[-1])  # the previous call's answer, as this one's
    return _module.Done(k=go.k, outputs=[_module.OutputRef(dtype="float32", shape=list(spill.shape),
                                                            stride=list(spill.stride()), spilled=True)])


_worker.ops = _worker.ops._replace(call=_replay)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
