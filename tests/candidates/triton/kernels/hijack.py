"""(Red team.) Hooks of the candidate's on the worker's socket (the socket module is not among what the
integrity check watches).

``kept()``: a copy of every descriptor the judge sends, kept, with the type of the message it came
with (``Go``, ``Spill``, ...).

``install(compute)`` hooks ``socket.recv_fds`` (the socket module is not among what the integrity check
watches). From the first call after the trials on, every ``Go`` is answered in the hook and never
reaches the worker: its inputs mapped, ``Ready`` sent at once, the spill buffer taken and ``compute(x,
y, out)`` run straight into it (no forward, no copy by the worker, no audit: findings forged as
audited and clean), then ``Done`` and ``Settled``. What this skips of the worker's standard path (its
decoding, the model call, the audit, the copy of the outputs) is in the yardstick the candidate is
compared with; the work itself is not, and must stay in the clock."""

import gc
import json
import os
import socket
import sys

import torch

_protocol, _exchange, _module = sys.modules["protocol"], sys.modules["exchange"], sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_orig_recv_fds = socket.recv_fds
_kept: list[tuple[int, str]] = []


def kept() -> list[tuple[int, str]]:
    """(a copy of each descriptor received, the type of its message), oldest first, from now on."""
    def recv_fds(sock, bufsize, maxfds, flags=0):
        data, fds, msg_flags, address = _orig_recv_fds(sock, bufsize, maxfds, flags)
        try:
            kind = json.loads(data).get("type", "") if data else ""
        except ValueError:
            kind = ""
        _kept.extend((os.dup(fd), kind) for fd in fds)
        return data, fds, msg_flags, address

    socket.recv_fds = recv_fds
    return _kept


def _view(raw, spec):
    return _exchange.view(raw, getattr(torch, spec.dtype), spec.shape, spec.stride, spec.offset)


def install(compute) -> None:
    state = {"trials": 0}

    def recv_fds(sock, bufsize, maxfds, flags=0):
        link = _worker.link
        while True:
            received = _orig_recv_fds(sock, bufsize, maxfds, flags)
            if link is None or sock is not link.sock or _worker.cuda:
                return received
            data, fds = received[0], received[1]
            try:
                message = json.loads(data) if data else {}
            except ValueError:
                message = {}
            if message.get("type") != "Go":
                return received
            state["trials"] += 1
            if state["trials"] <= 5:  # the trials: the worker's own path
                return received
            k, layout = message["k"], _worker.layouts[message["layout"]]
            inputs = _exchange.mapped(fds[0], layout.input_bytes)
            x, y = (_view(inputs, spec) for spec in layout.input_specs)
            sock.send(_protocol.Ready(k=k).encode())
            _, spill_fds, _, _ = _orig_recv_fds(sock, bufsize, maxfds, flags)
            spec = layout.spill_specs[0]
            compute(x, y, _view(_exchange.mapped(spill_fds[0], layout.spill_bytes), spec))
            gc.collect()  # the spill buffer's mapping, unmapped before the judge seals it
            for fd in (*fds, *spill_fds):
                os.close(fd)
            findings = _protocol.Findings(triton_launches=1, audited=True)
            sock.send(_protocol.Done(k=k, findings=findings, outputs=[_protocol.OutputRef(
                dtype=spec.dtype, shape=spec.shape, stride=spec.stride, spilled=True)]).encode())
            sock.send(_protocol.Settled(k=k).encode())

    socket.recv_fds = recv_fds
