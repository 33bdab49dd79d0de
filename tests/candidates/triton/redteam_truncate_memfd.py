"""Red team: shrinking the judge's memfds so that the judge's own reads of them fault.

The judge makes each call's memfds (its inputs, its spill buffer) and sends them to the worker. A
worker that truncated one (``ftruncate`` to zero) would have the judge's own reads of it touch pages
past the end of the file: SIGBUS, the trusted process dead on the candidate's word. This candidate
keeps every descriptor the judge sends (a hook on ``socket.recv_fds``) and, in each forward, truncates
them all. Their sizes are sealed: the harness must answer: rejected, the candidate's fault, and never
raise."""

import os
import socket

import torch.nn as nn

from kernels.relu_add import relu_add

_orig_recv_fds = socket.recv_fds
_kept: list[int] = []


def _recv_fds(sock, bufsize, maxfds, flags=0):
    data, fds, msg_flags, address = _orig_recv_fds(sock, bufsize, maxfds, flags)
    _kept.extend(os.dup(fd) for fd in fds)
    return data, fds, msg_flags, address


socket.recv_fds = _recv_fds


class ModelNew(nn.Module):
    def forward(self, x, y):
        for fd in _kept:
            os.ftruncate(fd, 0)
        return relu_add(x, y)
