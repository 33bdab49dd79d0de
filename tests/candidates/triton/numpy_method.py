"""numpy does relu(x + y), reached with no import: numpy is what Tensor.numpy() returns, and its
module is that array's type's; a no-op Triton launch is the alibi. The source rules refuse
`.numpy`; past them, the audit counts the tensor data handed to numpy. Must be rejected."""

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        a, b = x.contiguous().numpy(), y.contiguous().numpy()
        out = torch.as_tensor((a + b).clip(min=0))
        noop(out)
        return out
