"""A huge allocation in forward (2**44 float32 = 64 TiB, far past any limit). Must be a clear error."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.empty(1 << 44, dtype=torch.float32)
