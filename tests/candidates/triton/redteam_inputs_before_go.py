"""Red team (issue 45, class 2): the inputs seen before the call starts.

A worker that can read a call's inputs before its ``Go`` can compute beside the judge's own steps (a
native thread watching the inputs land during the judge's copy-in did), and that work escapes the
clock. This candidate keeps every descriptor the judge has sent it (a hook on ``socket.recv_fds``, the
socket module is not among what the integrity check watches) and, in each call, looks for the call's
inputs in every memfd it held *before* that call's ``Go`` arrived. It answers correctly only where it
found them there, and with zeros elsewhere: paid where the inputs can be seen before the call starts,
wrong (-1) where they cannot. The judge writes each call's inputs into a memfd made for that call alone
and sends it with the ``Go``, so the harness must find it wrong."""

import ctypes
import os
import socket

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

_orig_recv_fds = socket.recv_fds
_held: list[int] = []      # descriptors from messages before the latest Go
_latest: list[int] = []    # the latest Go's


def _recv_fds(sock, bufsize, maxfds, flags=0):
    data, fds, msg_flags, address = _orig_recv_fds(sock, bufsize, maxfds, flags)
    if fds and b'"type": "Go"' in data:
        _held.extend(_latest)
        _latest[:] = [os.dup(fd) for fd in fds]
    else:
        _held.extend(os.dup(fd) for fd in fds)
    return data, fds, msg_flags, address


socket.recv_fds = _recv_fds


def _seen_before(x: torch.Tensor) -> bool:
    wanted = ctypes.string_at(x.data_ptr(), min(x.numel() * x.element_size(), 4096))  # no torch operator: unaudited
    for fd in _held:
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
