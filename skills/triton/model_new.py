"""ModelNew: a faster, Triton implementation of Model (model.py). Read SKILL.md first.

Shape of a solution: @triton.jit kernels (here or in kernels/*.py) launched from forward().
forward() may only create tensors (outputs), launch your kernels and use tensor properties and
views (.shape, .contiguous(), .view()); all computation happens inside the Triton kernels.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def my_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # The skeleton of an elementwise kernel: program i handles elements [i*BLOCK, (i+1)*BLOCK).
    # As written it only copies x to out; replace the body with Model's computation.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        # Take exactly Model's constructor arguments. If Model has weights, create them here
        # under the same parameter/buffer names: the harness loads Model's state_dict into ModelNew.
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Give forward() Model.forward's inputs, allocate the outputs, launch your kernels.
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024
        my_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
        return out
