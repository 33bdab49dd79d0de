"""Honest for the 5 correctness trials, then an endless loop (in the warm-up / timed calls). The job
must end with a clear timeout error after EvalSettings.job_timeout_s."""

import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        while self.calls > 5:
            pass
        return relu_add(x, y)
