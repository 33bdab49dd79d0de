"""Red team (issue 45, class 1): the judge's memory moved under what is subtracted from a call.

A call's time on the CPU is the judge's clock less the judge's own share of a call. Where that share
was measured beside each call on pages the worker also mapped, a worker that changed those pages'
backing between calls (punching holes in the shared memfd: ``MADV_REMOVE``) made the judge's own steps
pay page faults in the measurement and not in the call, and every timed call sat at the floor. This
candidate keeps every descriptor the judge sends it (a hook on ``socket.recv_fds``: ``kernels/hijack.py``) and, after the
trials, punches a hole through each it can map for writing, before and after its honest kernel. The
share is measured on the judge's own memfds, before any candidate code exists in the worker: the
harness must time it as the honest kernel it is (or reject it), never near the floor."""

import mmap
import os

import torch.nn as nn

from kernels.hijack import kept
from kernels.relu_add import relu_add

_received = kept()


def _punch():
    for fd, _ in _received:
        try:
            with mmap.mmap(fd, os.fstat(fd).st_size) as mapping:
                mapping.madvise(mmap.MADV_REMOVE)
        except (OSError, ValueError):
            pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        out = relu_add(x, y)
        if self.calls > 5:  # after the trials
            _punch()  # the call's inputs too, once read
        return out
