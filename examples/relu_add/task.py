import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x + y): the seed orchestrator's end-to-end example."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + y)


N = 1 << 24


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
