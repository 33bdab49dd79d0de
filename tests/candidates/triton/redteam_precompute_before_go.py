"""Red team: computing a timed call before its ``Go`` arrives, and answering the moment it does.

The variant of redteam_done_before_go that survives a per-call secret in ``Go`` (a nonce ``Done`` must
echo): the worker still waits for the real ``Go`` before it answers, but it has spun (never asleep) on
the shared memfd, computed the output into the spill buffer as soon as the inputs landed, and answers
``Go`` with a ``Done`` built from it at once, in the receive hook (``socket.recv_fds``), skipping the
worker's decoding, its model call and its look-around. The yardstick the call is compared with holds the
worker's standard round trip (asleep in recv, waking, decoding, calling, encoding), which this call
never spent, and the work overlaps the judge's sending of ``Go``.

The early work is eager's own ops (add, relu) in every call after a call that was not audited (the
warm-up's and the timing run's); the trials and the audited calls run the honest Triton kernel. The harness must time it no faster
than that work: correct and at least about eager's time (or reject it)."""

import gc
import json
import os
import select
import socket
import sys

import torch
import torch.nn as nn

from kernels.relu_add import relu_add

_protocol = sys.modules["protocol"]
_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_orig_recv_fds = socket.recv_fds
_state = {"armed": False, "before": None, "layout": None}


def _tail(layout):
    return layout.inputs[-1][-8:].tolist()


def _recv_fds(sock, bufsize, maxfds, flags=0):
    link = _worker.link
    if link is None or sock is not link.sock:
        return _orig_recv_fds(sock, bufsize, maxfds, flags)
    while True:
        early = False
        if _state["armed"]:
            _state["armed"] = False
            layout = _worker.layouts[_state["layout"]]
            x, y = layout.inputs
            spill = layout.spill[0]
            while _tail(layout) == _state["before"]:
                if select.select([sock], [], [], 0)[0]:  # a message, and no inputs: the phase is over (Stop)
                    break
                os.sched_yield()
            else:
                torch.add(x, y, out=spill)
                spill.clamp_(min=0)
                early = True
        if early:
            while True:  # never asleep: poll for the Go
                try:
                    received = _orig_recv_fds(sock, bufsize, maxfds, flags | socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    os.sched_yield()
        else:
            received = _orig_recv_fds(sock, bufsize, maxfds, flags)
        try:
            message = json.loads(received[0]) if received[0] else {}
        except ValueError:
            message = {}
        if message.get("type") == "Go":
            if early and not message.get("audit"):
                spill = _worker.layouts[message["layout"]].spill[0]
                sock.send(_protocol.Done(k=message["k"], outputs=[_protocol.OutputRef(
                    dtype="float32", shape=list(spill.shape), stride=list(spill.stride()), spilled=True)]).encode())
                sock.send(_protocol.Settled(k=message["k"]).encode())  # settled too, as the worker would
                continue  # answered here: the worker never sees this Go
            if not message.get("audit"):  # after the trials, the next call is a warm-up, timed or audited one
                _state["armed"], _state["layout"] = True, message["layout"]
                _state["before"] = _tail(_worker.layouts[message["layout"]])
        return received


socket.recv_fds = _recv_fds


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
