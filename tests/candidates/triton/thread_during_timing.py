"""Honest compute, but a thread runs beside the timed calls and is gone before the end of the job
(where leftover threads are looked for): a thread could hold the interpreter while the harness
calibrates the synchronise it charges late work against. Must break the rules: the watch after
every timed call sees it."""

import threading

import torch.nn as nn

from kernels.relu_add import relu_add

START_AT_CALL = 12  # 5 trials and 3 warm-up calls come first
_stop = threading.Event()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls == START_AT_CALL:
            threading.Thread(target=_stop.wait, args=(600,), daemon=True, name="beside-the-timing").start()
        if self.calls == START_AT_CALL + 3:
            _stop.set()  # the thread ends well before the job does
        return relu_add(x, y)
