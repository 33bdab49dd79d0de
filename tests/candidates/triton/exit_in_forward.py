"""os._exit(0) in forward: the process vanishes with status 0 mid-job. Must be a clear error."""

from os import _exit

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        _exit(0)
