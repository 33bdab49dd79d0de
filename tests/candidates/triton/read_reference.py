"""Hunts for the reference outputs on disk (the harness's /job/ref, the parent's job directory, other
processes' roots and working directories, fds it may have inherited) and returns what it finds.
Without a find it returns zeros. Must be incorrect, and the log must say it found nothing."""

import glob
import os

import torch
import torch.nn as nn

from kernels.relu_add import noop

PATTERNS = [
    "/job/ref/*", "/job/*/ref_trial_*", "/job/*/*", "/job/cand/../ref/*", "/tmp/job-*/ref/*", "/tmp/*/ref/*",
    "/proc/*/cwd/ref/*", "/proc/*/root/tmp/job-*/ref/*", "/proc/*/root/job/ref/*", "/proc/self/fd/*",
    "/tmp/**/ref_trial_*",
]
found = []
for pattern in PATTERNS:
    for path in glob.glob(pattern, recursive=True):
        if "ref_trial" in path or os.path.islink(path):
            found.append((path, os.path.realpath(path)))
print("REF-HUNT found:", [f for f in found if "ref_trial" in f[0] or "ref_trial" in f[1]] or "nothing", flush=True)
references = sorted(p for p, real in found if "ref_trial" in real)
_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x, y):
        index = _calls[0]
        _calls[0] += 1
        if index < len(references):
            try:
                return torch.load(references[index], weights_only=True)
            except Exception as exc:  # noqa: BLE001
                print("REF-HUNT could not load", references[index], exc, flush=True)
        out = torch.zeros_like(x)
        noop(out)
        return out
