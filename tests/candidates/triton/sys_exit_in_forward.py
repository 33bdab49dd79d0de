"""raise SystemExit(0) in forward (a SystemExit, not an Exception). Must be a clear error."""

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        raise SystemExit(0)
