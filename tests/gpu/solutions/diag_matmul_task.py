import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 1 problem 12: diag(A) @ B."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


M = 4096
N = 4096


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
