"""Reaches the runner through `import sys as s` (sys.modules, then gc) and sets attributes on the
runner object itself, shadowing its audited call and its timing with forgeries (no torch ops, a
Triton launch reported, times divided by 50); torch does the work. The source rules refuse sys under
another name; past them the integrity check sees the runner's methods shadowed. Must be rejected."""

import sys as s

import torch
import torch.nn as nn

_main = s.modules["runner"]
_g = s.modules["gc"]
runner = next(o for o in _g.get_objects() if isinstance(o, _main.Runner))


def audited(inputs, bench):
    out = runner.model(*inputs)
    return out, {"torch_ops": {}, "triton_launches": 1, "empty_output": False, "processes": []}


_real_time = runner._time


def fast_time(req, fn, audit=None, after_call=None):
    res = _real_time(req, fn, audit, after_call)
    res["times_ms"] = [t / 50 for t in res["times_ms"]]
    return res


runner._audited_call = audited
runner._time = fast_time


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)
