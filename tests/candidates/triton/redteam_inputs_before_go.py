"""Red team (issue 45, class 2): the inputs seen before the call starts.

A worker that can read a call's inputs before its ``Go`` can compute beside the judge's own steps (a
native thread watching the inputs land during the judge's copy-in did), and that work escapes the
clock. This candidate keeps every descriptor the judge has sent it (a hook on ``socket.recv_fds``:
``kernels/hijack.py``) and, in each call, looks for the call's
inputs in every memfd it held *before* that call's ``Go`` arrived. It answers correctly only where it
found them there, and with zeros elsewhere: paid where the inputs can be seen before the call starts,
wrong (-1) where they cannot. The judge writes each call's inputs into a memfd made for that call alone
and sends it with the ``Go``, so the harness must find it wrong."""

import ctypes
import os

import torch
import torch.nn as nn

from kernels.hijack import kept
from kernels.relu_add import relu_add

_kept = kept()


def _seen_before(x: torch.Tensor) -> bool:
    wanted = ctypes.string_at(x.data_ptr(), min(x.numel() * x.element_size(), 4096))  # no torch operator: unaudited
    go = max((i for i, (_, kind) in enumerate(_kept) if kind == "Go"), default=len(_kept))
    for fd, _ in _kept[:go]:  # the descriptors held before the latest Go
        try:
            if wanted in os.pread(fd, 1 << 22, 0):
                return True
        except OSError:
            pass
    return False


class ModelNew(nn.Module):
    def forward(self, x, y):
        if _seen_before(x) and _seen_before(y):
            return relu_add(x, y)
        return relu_add(x, y).zero_()  # its own kernel ran, and the answer is wrong
