"""Hunts for anything of the reference's side on disk (the harness's /job/ref, the parent's job
directory, other processes' roots and working directories, fds it may have inherited): reference
outputs by their old name (ref_trial_*), or any file in a reference process's folder. A find
raises, so the job's error names it; without one it returns zeros. Must be incorrect ("elements
outside"), which only a hunt that found nothing gives."""

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

def _of_the_reference(path: str) -> bool:
    return "ref_trial" in path or "/ref/" in path


found = sorted({(path, os.path.realpath(path)) for pattern in PATTERNS for path in glob.glob(pattern, recursive=True)
                if os.path.isfile(path) and (_of_the_reference(path) or _of_the_reference(os.path.realpath(path)))})
print("REF-HUNT found:", found or "nothing", flush=True)


class ModelNew(nn.Module):
    def forward(self, x, y):
        if found:
            raise RuntimeError(f"REF-HUNT found files of the reference's side: {found[:5]}")
        out = torch.zeros_like(x)
        noop(out)
        return out
