"""Host-side launch and synchronise latency of one Triton kernel, by where the host thread runs.

A timed call's host side (Python, Triton's launcher, the driver) has to fit under the launch
cover (evaluators/child/timing.py), and the driver's cost depends on the CPU: on a multi-socket host a
thread on the far NUMA node reaches the GPU across the socket link. For each NUMA node this
process may use (and unpinned, the baseline), a fresh process pinned there times 2000 launches of
the fused relu(x + y) kernel on 16M elements (host time of ``ModelNew.forward``, which also
allocates the output) and 2000 empty synchronises.

    python benchmarks/launch_latency.py [--json launch_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL_FILE = HERE.parent / "tests" / "gpu" / "solutions" / "turn4_fused.py"

PROBE = r"""
import importlib.util, json, statistics, sys, time
import torch
spec = importlib.util.spec_from_file_location("turn4_fused", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
model = module.ModelNew()
x, y = torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")
for _ in range(20):
    model(x, y)
torch.cuda.synchronize()
launch, sync = [], []
for _ in range(2000):
    t0 = time.perf_counter_ns(); out = model(x, y); t1 = time.perf_counter_ns()
    torch.cuda.synchronize(); t2 = time.perf_counter_ns(); torch.cuda.synchronize(); t3 = time.perf_counter_ns()
    launch.append((t1 - t0) / 1e3); sync.append((t3 - t2) / 1e3)
    del out
q = lambda v, f: sorted(v)[int(f * (len(v) - 1))]
print(json.dumps({"launch_us_median": statistics.median(launch), "launch_us_p90": q(launch, 0.9),
                  "sync_us_median": statistics.median(sync), "sync_us_p90": q(sync, 0.9)}))
"""


def numa_nodes() -> dict[str, set[int]]:
    allowed, nodes = os.sched_getaffinity(0), {}
    for node in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        cpus = set()
        for part in filter(None, (node / "cpulist").read_text().strip().split(",")):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        if cpus & allowed:
            nodes[node.name] = cpus & allowed
    return nodes


def probe(cpus: set[int] | None) -> dict:
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    out = subprocess.run([sys.executable, "-c", PROBE, str(KERNEL_FILE)], capture_output=True, text=True,
                         preexec_fn=preexec, timeout=300)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("launch_latency.json"))
    args = parser.parse_args()
    nodes = numa_nodes()
    print(f"CPUs this process may use: {len(os.sched_getaffinity(0))}, on {len(nodes)} NUMA node(s)")
    rows = {"unpinned": probe(None)}
    for name, cpus in nodes.items():
        rows[f"{name} ({min(cpus)}-{max(cpus)}, {len(cpus)} CPUs)"] = probe(cpus)
    print(f"{'where':<28}{'launch us median':>18}{'p90':>8}{'sync us median':>16}{'p90':>8}")
    for name, row in rows.items():
        print(f"{name:<28}{row['launch_us_median']:>18.1f}{row['launch_us_p90']:>8.1f}{row['sync_us_median']:>16.1f}{row['sync_us_p90']:>8.1f}")
    args.json.write_text(json.dumps({"numa_nodes": {k: sorted(v) for k, v in nodes.items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
