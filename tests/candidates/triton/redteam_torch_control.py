"""Red team, control (not an attack on the clock): eager's own ops, relu(x + y) with torch, in every
call, through the worker's own path, run with the torch rule off (``own_kernels_only=False``; the
audit still runs). It is the yardstick for the attacks on the clock that do the same work
(redteam_done_before_go): they must not be timed meaningfully faster than this."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)
