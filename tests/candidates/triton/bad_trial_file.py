"""Plants cand_trial_<i>.pt -> /dev/zero in its job directory: the runner's save goes to /dev/zero in
the sandbox, and the trusted parent loads /dev/zero on the host, which is no tensor file. The job
must end with a result (an error), not an exception out of evaluate()."""

import os

import torch.nn as nn

from kernels.relu_add import relu_add

for _i in range(16):
    os.symlink("/dev/zero", f"/job/cand/cand_trial_{_i}.pt")


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
