"""For the task returning (relu(x + y), self.table[:16]) (a view of a buffer, as a rotary embedding's
cached cos/sin are): honest, the same view of its own buffer. Must be correct, timed runs included
(the harness must not overwrite a module's buffers when it poisons the outputs it has checked)."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.empty(64))

    def forward(self, x, y):
        return relu_add(x, y), self.table[:16]
