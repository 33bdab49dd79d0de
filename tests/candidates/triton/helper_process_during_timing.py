"""Honest compute, but starts a helper process only once the trials are over, in the middle of
the timed calls (a helper fed through CUDA IPC would work beyond the timing's synchronise), and
so is not there when the trials are audited. Must break the rules: the process watch runs after
every timed call."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

HELPER = "import time\ntime.sleep(600)\n"
START_AT_CALL = 12  # 5 trials and 3 warm-up calls come first


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.helper = None

    def forward(self, x, y):
        self.calls += 1
        if self.calls == START_AT_CALL:
            self.helper = torch.multiprocessing.get_context("spawn").Process(target=exec, args=(HELPER,), daemon=True)
            self.helper.start()
        return relu_add(x, y)
