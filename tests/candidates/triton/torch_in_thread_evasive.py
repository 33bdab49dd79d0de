"""Torch compute hidden in a helper thread that forward waits for (dispatch modes are thread-local),
started with the low-level _thread module. Must break the rules."""

import os, _thread  # noqa: E401

import torch
import torch.nn as nn

from kernels.relu_add import noop


class ModelNew(nn.Module):
    def forward(self, x, y):
        box, done = {}, _thread.allocate_lock()
        done.acquire()

        def work():
            box["out"] = torch.relu(x + y)
            done.release()

        _thread.start_new_thread(work, ())
        done.acquire()
        noop(box["out"])
        return box["out"]
