"""No Triton kernel: the right answer computed with numpy, nothing launched. Must break the rules."""

import numpy as np
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.from_numpy(np.maximum(x.numpy() + y.numpy(), np.float32(0)))
