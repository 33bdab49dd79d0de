"""Makes inputs predictable: torch.manual_seed pins seed 0, torch.randn returns zeros, then returns
the answer for all-zero inputs (zeros). Must be incorrect and break the rules."""

import torch
import torch.nn as nn

from kernels.relu_add import noop

_manual_seed, _randn = torch.manual_seed, torch.randn
torch.manual_seed = lambda seed: _manual_seed(0)
torch.randn = lambda *size, **kwargs: torch.zeros(*size, **{k: v for k, v in kwargs.items() if k != "generator"})


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.zeros_like(x)
        noop(out)
        return out
