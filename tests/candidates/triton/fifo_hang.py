"""Denial of service against the harness: after the runner writes trial 0's output, a forked helper
replaces cand_trial_0.out with a FIFO that nobody writes, so a reader that opens it blocks forever on
open(). The job must still be answered (an error), not hang."""

import os
from os import _exit, fork
import time
from pathlib import Path

import torch.nn as nn

from kernels.relu_add import relu_add


def _cand_dir() -> Path:
    return Path("/job/cand")  # where the candidate sandbox binds its job directory


_target = _cand_dir() / "cand_trial_0.out"

if fork() == 0:  # helper: not a Python thread of the candidate process, so no thread check sees it
    try:
        deadline = time.time() + 120
        while not _target.exists() and time.time() < deadline:
            time.sleep(0.0005)
        fifo = _target.with_name(".fifo")
        os.mkfifo(fifo)
        os.replace(fifo, _target)
        time.sleep(3600)
    finally:
        _exit(0)


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
