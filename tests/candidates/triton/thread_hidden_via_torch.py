"""Honest compute, but leaves a low-level thread running (one threading.enumerate does not list),
started through a module torch already imported (torch.utils.data.dataloader's threading), so no
import statement names a thread module. Must break the rules: the source rules refuse modules
reached as other modules' attributes, and past them the evaluator looks for threads by the
interpreter's own list of thread states."""

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

_threads = torch.utils.data.dataloader.threading
_stop = _threads.Event()


class ModelNew(nn.Module):
    def forward(self, x, y):
        _threads._start_new_thread(_stop.wait, (3600,))
        return relu_add(x, y)
