"""Red team: redteam_done_before_go with the honest work: the hook (``kernels/hijack.py``) runs the
honest Triton kernel straight into the spill buffer (the same work as honest.py, no torch compute at
all). What it skips of the worker's path is a small share of the interpreted kernel's time. The
harness must time it no faster than the honest kernel (within noise)."""

import torch.nn as nn

from kernels.hijack import install
from kernels.relu_add import relu_add

install(relu_add)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
