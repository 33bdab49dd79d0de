"""Red team: shrinking the judge's memfds so that the judge's own reads of them fault.

The judge makes each call's memfds (its inputs, its spill buffer) and sends them to the worker. A
worker that truncated one (``ftruncate`` to zero) would have the judge's own reads of it touch pages
past the end of the file: SIGBUS, the trusted process dead on the candidate's word. This candidate
keeps every descriptor the judge sends (a hook on ``socket.recv_fds``: ``kernels/hijack.py``) and, in each forward, truncates
them all. Their sizes are sealed: the harness must answer: rejected, the candidate's fault, and never
raise."""

import os

import torch.nn as nn

from kernels.hijack import kept
from kernels.relu_add import relu_add

_received = kept()


class ModelNew(nn.Module):
    def forward(self, x, y):
        for fd, _ in _received:
            os.ftruncate(fd, 0)
        return relu_add(x, y)
