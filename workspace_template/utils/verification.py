"""Check ModelNew against the reference: `python3 -m utils.verification`.

Runs on the trusted evaluation pool (never in this sandbox; the task's GPU, or the CPU):
{all_trials} on fresh random inputs with the reference's weights, within {tolerance}, plus
the skill's rules. Exit code 0 when correct.
"""

import sys

from utils._broker_client import request

if __name__ == "__main__":
    sys.exit(request("verify"))
