"""Red team (issue 45, class 3): an output computed in place of the worker's copy of it.

On the CPU the worker copies each output into the judge's spill buffer, a copy the yardstick (the task's
Model through the same worker) pays in every call. A forward that can reach that buffer computes its
output there and returns a view of it: the worker's copy is then a copy onto itself, and the candidate
is timed without it. This candidate looks, in each call, for a memfd it can map for writing that is
not the call's inputs (in ``/proc/self/fd``, and every descriptor the judge has sent it, kept by a hook
on ``socket.recv_fds``: ``kernels/hijack.py``), computes its output into it and returns that; it answers zeros where it finds
none. The judge sends a call's spill buffer only once its forward has returned (``Ready``), and seals
each against writes when the call is answered: the harness must find it wrong (-1)."""

import mmap
import os

import torch
import torch.nn as nn

from kernels.hijack import kept
from kernels.relu_add import relu_add

_received = kept()


def _writable_memfds():
    names = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kernel_env" in os.readlink(f"/proc/self/fd/{name}"):
                names.append(int(name))
        except OSError:
            pass
    for fd in dict.fromkeys(names + [fd for fd, _ in _received]):
        try:
            if "inputs" in os.readlink(f"/proc/self/fd/{fd}"):
                continue
            yield mmap.mmap(fd, os.fstat(fd).st_size)  # shared, writable: refused once sealed
        except (OSError, ValueError):
            pass


class ModelNew(nn.Module):
    def forward(self, x, y):
        for mapping in _writable_memfds():
            nbytes = x.numel() * 4
            if len(mapping) >= nbytes:  # the output lies last in the spill buffer's memfd
                out = torch.frombuffer(mapping, dtype=torch.float32, count=x.numel(), offset=len(mapping) - nbytes).view(x.shape)
                relu_add(x, y, out)
                return out
        return relu_add(x, y).zero_()  # its own kernel ran, and the answer is wrong
