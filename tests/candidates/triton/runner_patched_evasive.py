"""Rewrites the worker (its module, found in the module table), reached through
`from sys import modules`: the audited call reports no torch ops and one Triton launch, the
integrity check reports nothing, and every Done claims its call was a calibration call's.
Pure torch inside, no Triton at all. Must break the rules (and never be timed as faster than it is)."""

from sys import modules as _loaded

import torch
import torch.nn as nn

_worker = _loaded["worker"]
_Worker = _worker.Worker
_Worker._audited = lambda self, inputs: (self.model(*inputs), _worker.Findings(triton_launches=1, audited=True))
_Worker.integrity_report = lambda self: _worker.protocol.IntegrityAnswer()


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)
