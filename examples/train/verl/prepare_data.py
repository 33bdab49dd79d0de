"""verl's data set for kernel_env: one Parquet row per task, run by the ``kernel_env`` agent loop
(kernel_env_agent_loop.py) on a ``kernel-env serve`` session.

::

    python examples/train/verl/prepare_data.py --tasks ~/KernelBench --output ~/data/kernel_env_verl/train.parquet

A row: ``prompt`` (``kernel-env eval``'s system prompt and a placeholder user message, which the loop
replaces with the episode's own prompt), ``agent_name`` (verl picks the agent loop by it), ``task``
(a task spec the server resolves: ``example/relu_add``, ``kernelbench/L1/3`` when the server has
``--kernelbench``, a task file's path, ``FILE.jsonl#ID``), ``data_source`` and ``extra_info.index``
(verl's ``RLHFDataset`` reads them). Every column reaches the loop's ``run`` as a keyword.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import kernel_env
from kernel_env.workloads.runs.agent_eval import SYSTEM_PROMPT

AGENT_NAME = "kernel_env"


def task_specs(source: str) -> list[str]:
    """A spec the server resolves for each task of ``source``: the id of a bundled example or a
    KernelBench problem, a task file's path, ``FILE#ID`` for a task of a record file."""
    tasks = kernel_env.load_tasks(source)
    path = Path(source).expanduser()
    if path.suffix == ".py":
        return [str(path.resolve())]
    if path.is_file():
        return [f"{path.resolve()}#{task.id}" for task in tasks]
    if all(task.source in ("example", "kernelbench") for task in tasks):
        return [task.id for task in tasks]
    raise SystemExit(f"{source}: a folder of record files; give one record file, whose tasks are FILE#ID specs")


def rows(specs: list[str]) -> list[dict]:
    return [{"data_source": "kernel_env", "agent_name": AGENT_NAME, "task": spec, "extra_info": {"index": index},
             "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"# Task {spec}"}]}
            for index, spec in enumerate(specs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="examples",
                        help="a task source: a KernelBench checkout, a record file, a .py task, 'examples'")
    parser.add_argument("--output", type=Path, default=Path("~/data/kernel_env_verl/train.parquet"),
                        help="the Parquet file")
    args = parser.parse_args(argv)
    specs = task_specs(args.tasks)
    output = args.output.expanduser()
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows(specs)), output)
    print(f"{len(specs)} task(s) from {args.tasks} written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
