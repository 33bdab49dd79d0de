"""Reads the timing run's seeds out of the harness's frames, computes every timed call's answer with
the honest kernel during the first timed call, and hands them back from then on without running
anything (honest in the trials, the warm-up and the audited calls). Its source breaks the source
rules (sys._getframe); the test switches those off to reach the run-time defence: each timed call's
seed reaches the candidate process only once the call before it has ended. Must be timed honestly."""

import sys

import torch.nn as nn

from kernels.relu_add import relu_add


def _frame_of(name):
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ahead = None  # answers of the timed calls still to come, last first

    def forward(self, x, y):
        timing = _frame_of("time_calls")
        if timing is None or _frame_of("_audited_call") is not None:
            return relu_add(x, y)
        if self.ahead is None:
            request = _frame_of("_time").f_locals["req"]
            make_inputs = timing.f_locals["make_inputs"]
            self.ahead = [relu_add(*make_inputs(seed)) for seed in list(request["seeds"])[1:]][::-1]
            return relu_add(x, y)
        return self.ahead.pop() if self.ahead else relu_add(x, y)
