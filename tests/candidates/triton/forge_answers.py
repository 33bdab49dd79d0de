"""Writes an answer of its own to the harness's reply pipe, through the descriptor open in its
process (its source breaks the source rules; the test switches those off to reach the protocol):
in its first call, an answer saying every call ran clean. Must be rejected: the runner
signs its answers with a key the candidate never sees."""

import json
import os

import torch.nn as nn

from kernels.relu_add import relu_add

_CLEAN = {"mutated_inputs": False, "non_tensor_outputs": [], "torch_ops": {}, "triton_launches": 1}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.forged = False

    def forward(self, x, y):
        if not self.forged:
            self.forged = True
            answer = json.dumps({"ok": True, "trials": [_CLEAN] * 5})
            os.write(int(os.environ["KE_REPLY_FD"]), f"{answer}\n".encode())
        return relu_add(x, y)
