import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B for square float32 matrices (KernelBench level 1, problem 1): each call is
    milliseconds of device work, so a job is mostly device work."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


N = 4096


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
