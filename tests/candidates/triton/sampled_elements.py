"""Class: computing only what a sampled check would read. Only every 64th element of the output is
computed (the rest left as torch.empty gives it), as a candidate that learned a fingerprint's
sampled positions would. The judge compares every element of every call: wrong."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.zeros_like(x)
        relu_add(x[::64].contiguous(), y[::64].contiguous(), out[::64])
        return out
