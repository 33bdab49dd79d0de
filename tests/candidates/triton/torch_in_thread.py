"""Torch compute hidden in a helper thread that forward joins (dispatch modes are thread-local).
Must break the rules."""

import threading

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        box = {}
        worker = threading.Thread(target=lambda: box.setdefault("out", torch.relu(x + y)))
        worker.start()
        worker.join()
        noop(box["out"])
        return box["out"]
