"""Red team: answering a timed call before the judge has even sent its ``Go``.

On the CPU the judge's clock starts, the judge copies the call's inputs into the shared memfd, and only
then sends ``Go`` and waits for ``Done``; the yardstick every timed call is compared with (the task's Model through the worker)
holds the whole Go -> worker -> Done path of the worker's standard code. The worker can see the inputs land
in the shared memory before ``Go`` arrives. So it spins on the last elements of ``y`` in the memfd,
computes the output into the spill buffer the moment they change, and sends ``Done`` for the call
number it can predict (k only counts up) right away: by the time the judge waits for its answer, the
answer is already queued. The ``Go`` that follows is swallowed. Everything the worker's standard path
spends (waking up, decoding ``Go``, the model call, encoding ``Done``) is then taken out of the call's
time although the call never spent it, and the work itself overlaps the judge's own sending of ``Go``.

The hook is ``socket.recv_fds`` (the socket module is not among what the integrity check watches): it
sees every message the worker receives, so it knows each call's number and layout. Every call after
a call that was not audited (the trials all are) is answered early: the warm-up's and the timing
run's, and an audited one at a secret position, whose early answer carries no audit (a violation). No thread, no replaced harness attribute, no mode.

The early answer is computed with torch's eager ops (add, relu): eager's own work. The harness must
time it no faster than that work: correct and at least about eager's time (or reject it).
"""

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
    torch.add(x, y, out=spill)
    spill.clamp_(min=0)
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
