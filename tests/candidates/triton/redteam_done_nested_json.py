"""Red team: a ``Done`` the judge's JSON decoder cannot read (a deeply nested array).

``protocol.decode`` catches ValueError and UnicodeDecodeError from ``json.loads``, not the RecursionError
of a deeply nested array; ``Judge._receive_done`` catches EOFError and ProtocolError only, and
``Judge.drive`` WorkerFailed and _WorkerRaised. So the judge's Drive raises out of its phase: no Stop
reaches the worker, and the judge's runner answers the command with an error. The harness must still
answer: rejected, the candidate's fault, and never raise."""

import gc
import sys

import torch.nn as nn

from kernels.relu_add import relu_add

_module = sys.modules["worker"]
_worker = next(o for o in gc.get_objects() if isinstance(o, _module.Worker))
_depth = 50_000


class ModelNew(nn.Module):
    def forward(self, x, y):
        message = b'{"type": "Done", "k": 1, "outputs": ' + b"[" * _depth + b"]" * _depth + b"}"
        _worker.link.sock.send(message)
        return relu_add(x, y)
