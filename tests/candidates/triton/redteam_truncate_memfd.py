"""Red team: shrinking the judge's shared memfd so that the judge's own reads of it fault.

The judge allocates every call's shared buffer as a memfd and sends it to the worker, which maps it;
the memfd carries no seals, so the worker can ``ftruncate`` it to zero. The worker's forward writes its
output straight into the spill buffer (no copy by the worker), truncates the memfd and answers: the
judge's clone of the spill buffer, in its own process, touches pages past the end of the file and
takes SIGBUS. The trusted process dies on the candidate's word. The harness must answer: rejected, the
candidate's fault, and never raise."""

import gc
import os
import sys

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))


def _memfds():
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kernel_env-call" in os.readlink(f"/proc/self/fd/{name}"):
                yield int(name)
        except OSError:
            pass


class ModelNew(nn.Module):
    def forward(self, x, y):
        layout = next(iter(_worker.layouts.values()))
        spill = layout.spill[0]
        relu_add(x, y, spill)
        for fd in _memfds():
            os.ftruncate(fd, 0)
        return spill
