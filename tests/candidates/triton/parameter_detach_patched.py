"""Returns an nn.Parameter holding the inputs, and patches Parameter.detach (through an alias of the
class, which no source rule reads) to compute relu(x + y) with torch when the harness reads the
output, after the audit and after the end mark. Must be rejected: the output has an attribute of its
own, and the integrity check sees Parameter.detach hide Tensor.detach."""

import torch
import torch.nn as nn

from kernels.relu_add import noop

P = nn.Parameter
_plain_detach = torch.Tensor.detach


def lazy_detach(self):
    pending = self.pending if hasattr(self, "pending") else None
    if pending is None:
        return _plain_detach(self)
    x, y = pending
    return torch.relu(x + y)


P.detach = lazy_detach


class ModelNew(nn.Module):
    def forward(self, x, y):
        noop(x)
        p = P(torch.empty_like(x), requires_grad=False)
        p.pending = (x, y)
        return p
