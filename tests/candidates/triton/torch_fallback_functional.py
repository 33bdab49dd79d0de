"""Torch fallback with an alibi: F.relu(x + y), plus a Triton launch that does nothing. Must break the rules."""

import torch.nn as nn
import torch.nn.functional as F

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = F.relu(x.add(y))
        noop(out)
        return out
