"""For the two-output task, honest: the two kernel outputs in a namedtuple (a tuple subclass that
only names its fields). Must be correct."""

import collections

import torch.nn as nn

from kernels.relu_add import relu_add

Pair = collections.namedtuple("Pair", ["first", "second"])


class ModelNew(nn.Module):
    def forward(self, x, y):
        return Pair(relu_add(x, y), relu_add(y, x))
