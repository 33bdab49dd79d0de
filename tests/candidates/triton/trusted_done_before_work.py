"""Class: answering the judge before the work is done. The worker's reply is sent at once with the
output's place (the spill buffer the judge reads on the CPU) still empty; a thread of the
candidate's fills it 20 ms later. On a GPU the judge reads the buffer when the reply comes and its
clock stops only after that read: the output is not there (wrong), or it was and its time is in the
clock. On the CPU the thread still maps the call's spill buffer for writing when the reply comes, so
the judge cannot seal it against writes, and the call fails. Must never be correct and faster than
the honest kernel."""

import gc
import sys
import threading
import time

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_exchange, _protocol = sys.modules["exchange"], sys.modules["protocol"]


def _fill_later(spill, x, y):
    time.sleep(0.02)
    relu_add(x, y, spill)


def _early(worker, go, fds):
    layout = worker.layouts[go.layout]
    if worker.cuda:
        x, y = layout.inputs
        spill, spec = layout.spill[0], None
    else:  # the CPU: the call's inputs come with the Go, its spill buffer once the worker says it is ready
        raw = _exchange.mapped(fds[0], layout.input_bytes)
        x, y = (_exchange.view(raw, torch.float32, s.shape, s.stride, s.offset) for s in layout.input_specs)
        worker.link.send(_protocol.Ready(k=go.k))
        _, spill_fds = worker.link.recv(_protocol.Spill)
        spec = layout.spill_specs[0]
        spill = _exchange.view(_exchange.mapped(spill_fds[0], layout.spill_bytes), torch.float32, spec.shape,
                               spec.stride, spec.offset)
    threading.Thread(target=_fill_later, args=(spill, x.clone(), y.clone()), daemon=True).start()
    return _module.Done(k=go.k, outputs=[_module.OutputRef(dtype="float32", shape=list(spill.shape),
                                                            stride=list(spill.stride()), spilled=True)])


_worker.ops = _worker.ops._replace(call=_early)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
