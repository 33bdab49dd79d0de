"""Plants cand_trial_<i>.out -> /dev/zero in its job directory: the runner's write goes to /dev/zero in
the sandbox, and the link moves to the reference's directory, where /dev/zero is no output file. The
job must end with a result (an error), not an exception out of evaluate()."""

import os

import torch.nn as nn

from kernels.relu_add import relu_add

for _i in range(16):
    os.symlink("/dev/zero", f"/job/cand/cand_trial_{_i}.out")


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
