"""Client side of the evaluation broker (shared by verification.py and profiling.py).

Nothing here evaluates anything: it asks the broker outside the sandbox to snapshot this
workspace and evaluate it on the trusted evaluation pool (this task's device: a GPU, or the CPU
for a cpu task), then prints the report, whose first line names that device.
"""

import json
import os
import socket
import sys


def request(op: str) -> int:
    path = os.environ.get("KE_BROKER", "/run/kernel_env/broker/broker.sock")
    if not os.path.exists(path):
        print(f"The evaluation broker is not reachable ({path} does not exist).\n"
              "utils.verification and utils.profiling work inside a kernel_env sandbox, where they send this\n"
              "workspace to the trusted evaluation pool. Open one with `kernel-env run-task TASK`.", file=sys.stderr)
        return 2
    # The sandbox does not know the task's device (the report's first line names it), so this
    # line names none: "the GPU pool" misled every CPU run.
    print(f"Submitting the workspace for {op} to the trusted evaluator outside this sandbox; waiting for its "
          "report...", flush=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall(json.dumps({"op": op}).encode() + b"\n")
        chunks = []
        while True:
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        print("The broker closed the connection without an answer.", file=sys.stderr)
        return 2
    print(answer["report"])
    result = answer.get("result") or {}
    return 0 if result.get("correct") else 1
