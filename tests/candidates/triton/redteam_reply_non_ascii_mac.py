"""Red team: making the harness raise by a line on its reply pipe, no key needed.

The harness reads a child's answer as ``text<TAB>mac`` and checks the mac with ``hmac.compare_digest``
before anything else (children.Child.receive). ``compare_digest`` of two ``str`` raises TypeError when
either holds a non-ASCII character. The candidate writes one line whose "mac" is non-ASCII to the reply
descriptor open in its process (KE_REPLY_FD) while ModelNew is imported: the harness's read of the
Load answer raises TypeError, which nothing in the harness catches, so ``evaluate()`` raises instead of
returning a result, and the pool answers an exception with ``fault="evaluator"`` (no -1). A candidate
that cannot solve the task would escape its -1 this way. The harness must answer: rejected, the
candidate's fault ("an answer ... that the harness did not write"), and never raise."""

import os

import torch.nn as nn

from kernels.relu_add import relu_add

os.write(int(os.environ["KE_REPLY_FD"]), "forged\t\u00e9\n".encode())


class ModelNew(nn.Module):
    def forward(self, x, y):
        return relu_add(x, y)
