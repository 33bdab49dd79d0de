"""Returns an empty plain tensor with `to` and `reshape` set on the tensor itself, so that the
harness's reads of the output would run the candidate's code (torch computing relu(x + y)) after the
audit and the end mark. Must be rejected: an output with attributes of its own is not a plain tensor."""

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        plain_to, plain_reshape = out.to, out.reshape
        out.to = lambda *args, **kwargs: torch.relu(x + y).to(*args, **kwargs)
        out.reshape = lambda *args: torch.relu(x + y).reshape(*args)
        return out
