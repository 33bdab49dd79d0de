import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(v < 0, 0.0, v), mask=mask)


class ModelNew(nn.Module):
    """Honest Triton while the device is idle (the trials), torch while something runs ahead of
    the call (a timed call queued behind the judge's go): an audit that met an idle device would never see
    the torch. Must be rejected."""

    def forward(self, x, y):
        for _ in range(1000):  # some tens of microseconds (no clock: the source rules refuse one):
            pass               # longer than making these inputs takes, shorter than the cover
        if torch.cuda.current_stream().query():
            out = torch.empty_like(x)
            kernel[(triton.cdiv(x.numel(), 4096),)](x, y, out, x.numel(), BLOCK=4096, num_warps=8)
            return out
        return torch.relu(x + y)
