"""Launches a Triton kernel that never ends (it waits for a flag nobody sets): a bad sample whose
kernel keeps the GPU busy while its process is frozen, until the process is killed."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def spin(flag_ptr, out_ptr):
    count = 0
    while tl.load(flag_ptr, volatile=True) == 0:
        count += 1
    tl.store(out_ptr, count)


class ModelNew(nn.Module):
    def forward(self, x, y):
        flag, out = torch.zeros(1, dtype=torch.int32, device=x.device), torch.empty_like(x)
        spin[(1,)](flag, out)
        return out
