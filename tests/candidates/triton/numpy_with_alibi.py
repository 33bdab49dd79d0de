"""Compute outside torch and Triton: numpy does relu(x + y); a no-op Triton launch is the alibi.
The skill forbids third-party compute; the harness should not accept it."""

import numpy as np
import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.from_numpy(np.maximum(x.numpy() + y.numpy(), np.float32(0)))
        noop(out)
        return out
