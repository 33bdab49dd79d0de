"""Red team: the call protocol answered past the worker's own code, with eager's work.

A hook answers every call after the trials itself (``kernels/hijack.py``): it takes the inputs with
the ``Go``, says ``Ready`` at once, and computes relu(x + y) with torch's eager ops straight into the
call's spill buffer, skipping the worker's decoding, its model call, its audit and its copy of the
outputs, all of which the yardstick spent. The inputs cannot be had before the ``Go`` (a memfd made
for the call alone comes with it), and the spill buffer is sealed when the ``Done`` comes: the work
is inside the clock. The harness must time it no faster than that work (about eager's time, as the
control measures it through the worker's own path), or reject it."""

import torch
import torch.nn as nn

from kernels.hijack import install
from kernels.relu_add import relu_add


def _eager(x, y, out):
    torch.add(x, y, out=out)
    out.clamp_(min=0)


install(_eager)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
