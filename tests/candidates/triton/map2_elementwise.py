"""Python computes relu(x + y) element by element through Tensor.map2_ (torch's C++ loop calls the
function on each element, through no ATen operator the audit sees); a no-op Triton launch is the
alibi. The source rules refuse map2_; past them the audit counts the elements handed to Python.
Must be rejected."""

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        out.copy_(x)
        out.map2_(x, y, lambda _, a, b: max(a + b, 0.0))
        return out
