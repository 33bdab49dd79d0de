"""Class: answering the judge before the work is done. The worker's reply is sent at once with the
output's place (the spill buffer the judge reads on the CPU) still empty; a thread of the
candidate's fills it 20 ms later. The judge reads the buffer when the reply comes and its clock stops
only after that read: the output is not there (wrong), or it was and its time is in the clock.
Must never be correct and faster than the honest kernel."""

import gc
import sys
import threading
import time

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_call, _share = _worker.ops.call, _worker.ops.share


def _fill_later(spill, x, y):
    time.sleep(0.02)
    relu_add(x, y, spill)


def _early(worker, go):
    layout = worker.layouts[go.layout]
    x, y = layout.inputs
    spill = layout.spill[0]
    threading.Thread(target=_fill_later, args=(spill, x.clone(), y.clone()), daemon=True).start()
    return _module.Done(k=go.k, outputs=[_module.OutputRef(dtype="float32", shape=list(spill.shape),
                                                            stride=list(spill.stride()), spilled=True)])


_worker.ops = _worker.ops._replace(call=_early)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
