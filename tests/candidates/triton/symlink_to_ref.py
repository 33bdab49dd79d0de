"""Makes the harness read something of the reference's side as the candidate's answer: the runner
writes each trial's outputs to <cand dir>/cand_trial_<i>.out, and the harness moves that file into
the reference process's directory, where that process reads it. Planting cand_trial_<i>.out as a
relative link to state_dict.pt or init_inputs.pt (the candidate's directory holds copies of both,
so the runner's write goes through the link into the copy; the reference's directory holds the
originals), a reader that followed the moved link would read a file of the reference's. Forward
computes nothing. Must be incorrect.
"""

import os
from pathlib import Path

import torch
import torch.nn as nn

from kernels.relu_add import noop


def _cand_dir() -> Path:
    return Path("/job/cand")  # where the candidate sandbox binds its job directory


_cand = _cand_dir()
for _i in range(16):
    _link = _cand / f"cand_trial_{_i}.out"
    if not _link.exists():
        os.symlink("init_inputs.pt" if _i % 2 else "state_dict.pt", _link)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        noop(out)
        return out
