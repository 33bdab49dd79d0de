"""Makes the harness read something of the reference's side as the candidate's answer: the runner
writes each trial's outputs to <cand dir>/cand_trial_<i>.out, and the harness moves that file into
the reference process's directory, where that process reads it. Planting cand_trial_<i>.out as a
relative link (to ../ref/ref_trial_<i>.pt, where the reference's outputs were once saved, and to
state_dict.pt, which sits in the reference's directory) and creating ../ref here (the sandbox root is
writable), the runner's write goes through the link into the sandbox's private ../ref, and a reader
that followed the link would read a file of the reference's. Forward computes nothing. Must be
incorrect.
"""

import os
from pathlib import Path

import torch
import torch.nn as nn

from kernels.relu_add import noop


def _cand_dir() -> Path:
    return Path("/job/cand")  # where the candidate sandbox binds its job directory


_cand = _cand_dir()
(_cand.parent / "ref").mkdir(exist_ok=True)
for _i in range(16):
    _link = _cand / f"cand_trial_{_i}.out"
    if not _link.exists():
        os.symlink(f"../ref/ref_trial_{_i}.pt" if _i % 2 else "state_dict.pt", _link)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        return out
