"""SkyRL's data set for kernel_env: one Parquet row per task, as ``kernel_env.integrations.skyrl.dataset_rows``
makes them (the prompt, ``env_class="kernel_agent"``, and the task's record itself, so SkyRL's workers
need no task files or KernelBench checkout).

::

    python examples/train/skyrl/prepare_data.py --tasks ~/KernelBench --output ~/data/kernel_env/train.parquet

Written with pyarrow (a base dependency of kernel_env): it needs kernel_env with its `skyrl` extra only.

SkyRL reads the rows with ``datasets`` (``skyrl/train/dataset/dataset.py``, ``PromptDataset``): ``prompt``
and ``env_class`` are taken out, every other column is the row's ``env_extras`` (here ``task``). It asserts
the data set has at least ``trainer.train_batch_size`` rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import kernel_env
from kernel_env.integrations.skyrl import dataset_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="examples",
                        help="a task source: a KernelBench checkout, a record file or folder, a .py task, 'examples'")
    parser.add_argument("--output", type=Path, default=Path("~/data/kernel_env/train.parquet"), help="the Parquet file")
    args = parser.parse_args(argv)
    rows = dataset_rows(kernel_env.load_tasks(args.tasks))
    output = args.output.expanduser()
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), output)
    print(f"{len(rows)} task(s) from {args.tasks} written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
