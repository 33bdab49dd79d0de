"""torch computes relu(x + y) inside a custom operator of its own named `clone` (torch.library), whose
body the dispatch audit does not see and whose name is an allowed ATen one; a no-op Triton launch is
the alibi. The source rules refuse torch.library; past them the audit names the operator by its
namespace too. Must be rejected."""

import torch
import torch.nn as nn
from torch.library import custom_op

from kernels.relu_add import noop


@custom_op("kernels::clone", mutates_args=())
def clone(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y)


class ModelNew(nn.Module):
    def forward(self, x, y):
        noop(x)
        return clone(x, y)
