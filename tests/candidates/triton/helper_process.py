"""Honest compute, but starts a helper process when built. A process of its own has a CUDA
context of its own, which the timing's device-wide synchronise does not wait for: fed the inputs
through CUDA IPC it could finish the work after the end mark, unseen. Must break the rules (the
source rules name torch.multiprocessing; with them off, the run-time process watch must)."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

HELPER = "import time\ntime.sleep(600)\n"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.helper = torch.multiprocessing.get_context("spawn").Process(target=exec, args=(HELPER,), daemon=True)
        self.helper.start()

    def forward(self, x, y):
        return relu_add(x, y)
