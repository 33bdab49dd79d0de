"""relu(x + y) with one fused, vectorised CUDA kernel (kernels/relu_add.cu), bound as cuda_extension.relu_add."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cuda_extension.relu_add(x.contiguous(), y.contiguous())
