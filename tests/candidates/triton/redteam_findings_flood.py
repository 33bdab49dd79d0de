"""Red team: the judge's answer made longer than the protocol allows, by the worker's findings.

The judge copies each call's ``Findings`` (the worker's word, one socket message each, ~200 KB at most)
into its ``DriveAnswer``. The candidate wraps ``socket.socket.send`` (not watched) and adds 10 000
made-up operator names to every unaudited ``Done`` (the audited trials stay clean, so the timing run
happens): over the timing run's 60-odd calls the judge's answer to Drive grows past the 4 MiB the
harness reads from a child, and the harness kills the judge. The trusted process is ended on the
candidate's doing: the harness must answer rejected, the candidate's fault (never the evaluator's),
and never raise."""

import json
import socket

import torch.nn as nn

from kernels.relu_add import relu_add

_FLOOD = {f"op{i:07d}": 1 for i in range(10_000)}
_send = socket.socket.send


def _flooding_send(sock, data, *args):
    if isinstance(data, (bytes, bytearray)) and data.startswith(b'{"type": "Done"'):
        message = json.loads(data)
        if message.get("findings") is None:
            message["findings"] = {"torch_ops": _FLOOD, "triton_launches": 1, "empty_output": False, "audited": True}
            data = json.dumps(message).encode()
    return _send(sock, data, *args)


socket.socket.send = _flooding_send


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
