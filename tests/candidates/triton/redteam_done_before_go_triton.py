"""Red team: redteam_done_before_go with the honest work: the early answer runs the honest Triton kernel
(the same work as honest.py, no torch compute at all). The discount is the same (the worker's standard
round trip, in the yardstick but never spent); against the interpreted kernel's ~2.7 ms it is a smaller
share. The harness must time it no faster than the honest kernel (within noise)."""

import gc
import json
import os
import select
import socket
import sys

import torch.nn as nn

from kernels.relu_add import relu_add

_protocol = sys.modules["protocol"]
_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_orig_recv_fds = socket.recv_fds
_state = {"k": 0, "layout": None, "armed": False, "swallow": None, "before": None}


def _tail(layout):
    return layout.inputs[-1][-8:].tolist()


def _answer_early(sock):
    """Wait for the next call's inputs to land in the shared memory, compute, and answer at once."""
    layout = _worker.layouts[_state["layout"]]
    x, y = layout.inputs
    spill = layout.spill[0]
    before = _state["before"]
    while _tail(layout) == before:  # the judge copies x, then y: y's last elements land last
        if select.select([sock], [], [], 0)[0]:  # a message, and no inputs: the phase is over (Stop)
            return
        os.sched_yield()  # leave the judge its core on a busy 2-core machine
    relu_add(x, y, spill)
    k = _state["k"] + 1
    done = _protocol.Done(k=k, outputs=[_protocol.OutputRef(dtype="float32", shape=list(spill.shape),
                                                            stride=list(spill.stride()), spilled=True)])
    sock.send(done.encode())
    _state["swallow"] = k


def _recv_fds(sock, bufsize, maxfds, flags=0):
    link = _worker.link
    if link is None or sock is not link.sock:
        return _orig_recv_fds(sock, bufsize, maxfds, flags)
    while True:
        if _state["armed"]:
            _state["armed"] = False
            _answer_early(sock)
        received = _orig_recv_fds(sock, bufsize, maxfds, flags)
        try:
            message = json.loads(received[0]) if received[0] else {}
        except ValueError:
            message = {}
        if message.get("type") == "Go":
            _state["k"], _state["layout"] = message["k"], message["layout"]
            if _state["swallow"] == message["k"]:  # answered already: settled too, as the worker would
                _state["swallow"] = None
                sock.send(_protocol.Settled(k=message["k"]).encode())
                continue
            if not message.get("audit"):  # after the trials, the next call is a warm-up, timed or audited one
                _state["armed"] = True
                _state["before"] = _tail(_worker.layouts[message["layout"]])
        return received


socket.recv_fds = _recv_fds


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
