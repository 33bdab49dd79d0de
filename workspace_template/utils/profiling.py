"""Check and time ModelNew against eager PyTorch and torch.compile: `python3 -m utils.profiling`.

Runs on the trusted evaluation pool (the task's GPU, or the CPU): the correctness check of
utils.verification, then the same timing protocol for ModelNew, eager and torch.compile
(median per call, cache flushed between calls). Prints the speed-ups and the milestone
reached. Exit code 0 when correct.
"""

import sys

from utils._broker_client import request

if __name__ == "__main__":
    sys.exit(request("profile"))
