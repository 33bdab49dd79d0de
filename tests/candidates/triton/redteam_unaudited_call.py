"""Red team (issue 45, class 4): a call the audit skips, told from the rest.

Where some calls run under the worker's dispatch audit and others do not, a forward that tells them
apart (the audit's mode on torch's stack, a count of calls, the writes it sees land) runs torch on the
unaudited ones and its own kernel where the audit looks: the forbidden path is never seen. This
candidate looks for the audit's mode on the stack and, on any call that runs without it, raises: a
probe of the condition every attack of the class needs. Every call of a candidate's worker runs under
the audit, so it must never raise: the harness must judge it as the honest kernel it then is."""

import torch.nn as nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from kernels.relu_add import relu_add


class ModelNew(nn.Module):
    def forward(self, x, y):
        if not _get_current_dispatch_mode_stack():
            raise RuntimeError("a call ran without the audit: torch could compute here unseen")
        return relu_add(x, y)
