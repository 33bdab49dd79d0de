"""Task sources in the shapes of the public data sets, read from small files each test writes:
the KernelBench export (Parquet), CUDA-Agent-Ops-6K (Parquet and JSONL), KernelBook (Parquet and
JSONL, with its paired Triton code) and the synthesis output; and `kernel-env tasks` on them.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import TINY_TASK
from typer.testing import CliRunner

from kernel_env.cli import app
from kernel_env.tasks import (
    Task,
    TaskError,
    load_kernelbench,
    load_tasks,
    resolve_task,
    validate_task,
)
from kernel_env.tasks.sources import detect_shape, kernelbook_code, write_records

runner = CliRunner()


def _variant(n: int) -> str:
    """TINY_TASK with its own content hash."""
    return TINY_TASK.replace("8, 16", f"8, {16 + n}")


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _kernelbench_rows() -> list[dict]:
    """The HF export's shape: one row per problem, names keeping the file's number prefix."""
    problems = [(1, 1, "1_Square_matrix_multiplication_"), (1, 2, "2_Standard_matrix_multiplication_.py"),
                (2, 12, "12_Gemm_Multiply_LeakyReLU"), (3, 5, "5_AlexNet")]
    return [{"code": _variant(level * 100 + pid), "level": level, "name": name, "problem_id": pid}
            for level, pid, name in problems]


# ----------------------------------------------------------------------------- KernelBench


def test_a_kernelbench_parquet_export_gives_the_checkouts_ids(tmp_path):
    path = _write_parquet(tmp_path / "kernelbench.parquet", _kernelbench_rows())
    tasks = load_tasks(path)
    assert [t.id for t in tasks] == ["kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L2/12", "kernelbench/L3/5"]
    gemm = tasks[2]
    assert (gemm.source, gemm.level, gemm.problem_id, gemm.name) == ("kernelbench", 2, 12, "Gemm_Multiply_LeakyReLU")
    assert tasks[1].name == "Standard_matrix_multiplication_"  # ".py" and the "2_" prefix are not part of the name

    checkout = tmp_path / "KernelBench"
    for row in _kernelbench_rows():
        folder = checkout / f"level{row['level']}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{row['name'].removesuffix('.py')}.py").write_text(row["code"])
    from_checkout = load_kernelbench(checkout)
    assert [(t.id, t.hash) for t in from_checkout] == [(t.id, t.hash) for t in tasks]


def test_a_data_set_folder_of_parquet_shards_loads_as_one_source(tmp_path):
    rows = _kernelbench_rows()
    for level in (1, 2, 3):
        _write_parquet(tmp_path / "snapshot" / "data" / f"level_{level}-00000-of-00001.parquet",
                       [r for r in rows if r["level"] == level])
    tasks = load_tasks(tmp_path / "snapshot")
    assert [t.id for t in tasks] == ["kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L2/12", "kernelbench/L3/5"]
    assert resolve_task(f"{tmp_path / 'snapshot'}#kernelbench/L2/12").name == "Gemm_Multiply_LeakyReLU"


def test_a_kernelbench_row_without_a_problem_id_is_refused_by_row(tmp_path):
    rows = _kernelbench_rows()
    rows[1]["problem_id"] = None
    path = _write_parquet(tmp_path / "kb.parquet", rows)
    with pytest.raises(TaskError, match=r"^task kb.parquet:row 1: a KernelBench row needs level and problem_id"):
        load_tasks(path)


# ----------------------------------------------------------------------------- CUDA-Agent-Ops-6K


def _ops_rows() -> list[dict]:
    return [{"ops": ["nn.Conv2d", "torch.relu"], "data_source": "torch#2", "code": _variant(1)},
            {"ops": ["nn.GELU"], "data_source": "torch#1", "code": _variant(2)},
            {"ops": ["LlamaRMSNorm"], "data_source": "transformers#1", "code": _variant(3)}]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_ops6k_rows_get_row_ids_and_keep_their_ops(tmp_path, suffix):
    path = tmp_path / f"train-00000-of-00001{suffix}"
    if suffix == ".parquet":
        _write_parquet(path, _ops_rows())
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in _ops_rows()))
    tasks = load_tasks(path)
    assert [t.id for t in tasks] == ["ops6k/0", "ops6k/1", "ops6k/2"]
    first = tasks[0]
    assert first.source == "ops6k" and first.name == "nn.Conv2d_torch.relu"
    assert first.metadata == {"ops": ["nn.Conv2d", "torch.relu"], "data_source": "torch#2"}
    assert first.code == _variant(1)


def test_rows_without_a_code_column_name_the_columns_looked_for_and_found(tmp_path):
    path = _write_parquet(tmp_path / "ops.parquet", [{"ops": ["nn.ReLU"], "data_source": "torch#1", "program": "x"}])
    with pytest.raises(TaskError) as caught:
        load_tasks(path)
    message = str(caught.value)
    assert message.startswith("task ops.parquet:row 0: no code field (a column named one of code, pytorch_code, python_code")
    assert message.endswith("the row has data_source, ops, program)")


def test_a_json_list_of_records_loads_like_jsonl(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"id": "mine/a", "code": _variant(1)}, {"id": "mine/b", "code": _variant(2)}]))
    assert [(t.id, t.source) for t in load_tasks(path)] == [("mine/a", "mine"), ("mine/b", "mine")]


def test_two_tasks_with_one_id_are_refused(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"id": "same", "code": _variant(i)}) + "\n" for i in range(2)))
    with pytest.raises(TaskError, match="two tasks have the id same"):
        load_tasks(path)


# ----------------------------------------------------------------------------- KernelBook

KERNELBOOK_PYTHON = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class ScaledSum(nn.Module):
        def __init__(self, dim, scale=1.0):
            super(ScaledSum, self).__init__()
            self.dim = dim
            self.scale = scale

        def forward(self, x):
            return torch.sum(x, dim=self.dim) * self.scale


    def get_inputs():
        return [torch.rand([4, 4, 4, 4])]


    def get_init_inputs():
        return [[], {'dim': 1, 'scale': 2.0}]
    """
)
KERNELBOOK_TRITON = "import triton\n\n@triton.jit\ndef scaled_sum_kernel(x_ptr, out_ptr):\n    pass\n"


def _kernelbook_rows() -> list[dict]:
    return [{"entry_point": "ScaledSum", "original_triton_code": "", "python_code": KERNELBOOK_PYTHON,
             "triton_code": KERNELBOOK_TRITON, "repo_name": "someone/project", "module_name": "ScaledSum",
             "synthetic": False, "uuid": 17, "licenses": ["MIT"], "stars": 3, "sha": "abc123",
             "repo_link": "https://example.invalid/someone/project"}]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_kernelbook_rows_keep_their_triton_code_and_become_kernelbench_format(tmp_path, suffix):
    path = tmp_path / f"kernelbook{suffix}"
    if suffix == ".parquet":
        _write_parquet(path, _kernelbook_rows())
    else:
        path.write_text(json.dumps(_kernelbook_rows()[0]) + "\n")
    (task,) = load_tasks(path)
    assert (task.id, task.source, task.name) == ("kernelbook/17", "kernelbook", "ScaledSum")
    assert task.metadata["triton_code"] == KERNELBOOK_TRITON
    assert task.metadata["repo_name"] == "someone/project" and task.metadata["licenses"] == ["MIT"]
    assert task.code.startswith(KERNELBOOK_PYTHON.rstrip()) and "\nModel = ScaledSum\n" in task.code
    task.check_source()


def test_the_kernelbook_adapter_passes_keyword_init_inputs_positionally():
    """The adapter is real code: the locked-down probe builds Model(*get_init_inputs()) and runs it."""
    info = validate_task(Task(id="kernelbook/17", code=kernelbook_code(KERNELBOOK_PYTHON, "ScaledSum")))
    assert info.init_inputs == ["int", "float"]  # [[], {'dim': 1, 'scale': 2.0}] became [1, 2.0]
    assert info.outputs == [{"shape": [4, 4, 4], "dtype": "float32"}]


def test_the_shape_of_rows_is_told_by_their_columns():
    assert detect_shape(["code", "level", "name", "problem_id"]) == "kernelbench"
    assert detect_shape(["python_code", "triton_code", "uuid"]) == "kernelbook"
    assert detect_shape(["python_code", "repo_name"]) == "kernelbook"
    assert detect_shape(["code", "ops", "data_source"]) == "ops6k"
    assert detect_shape(["id", "code"]) == "ops6k"


# ----------------------------------------------------------------------------- synthesis output


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_written_task_set_reads_back_with_its_provenance(tmp_path, suffix):
    tasks = [Task(id=f"synthetic/{i}", code=_variant(i), source="synthetic", name=f"Linear_ReLU_{i}",
                  metadata={"ops": ["Linear", "ReLU"], "data_source": "torch#2",
                            "provenance": {"composer": "deterministic", "seed": 0, "index": i, "eager_ms": 1.5}})
             for i in range(3)]
    path = write_records(tasks, tmp_path / f"synth{suffix}")
    back = load_tasks(path)
    assert [(t.id, t.source, t.name, t.hash) for t in back] == [(t.id, t.source, t.name, t.hash) for t in tasks]
    assert back[2].metadata == tasks[2].metadata


# ----------------------------------------------------------------------------- kernel-env tasks


def _ids(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [r["id"] for r in json.loads(result.stdout)]


def test_kernel_env_tasks_lists_and_filters_a_parquet_source(tmp_path):
    path = str(_write_parquet(tmp_path / "kernelbench.parquet", _kernelbench_rows()))
    assert _ids(runner.invoke(app, ["tasks", path, "--json"])) == [
        "kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L2/12", "kernelbench/L3/5"]
    assert _ids(runner.invoke(app, ["tasks", path, "--level", "1", "--json"])) == ["kernelbench/L1/1", "kernelbench/L1/2"]
    assert _ids(runner.invoke(app, ["tasks", path, "--name", "gemm", "--json"])) == ["kernelbench/L2/12"]
    assert _ids(runner.invoke(app, ["tasks", path, "--count", "3", "--json"])) == [
        "kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L2/12"]
    sample = _ids(runner.invoke(app, ["tasks", path, "--sample", "2", "--seed", "3", "--json"]))
    assert sample == _ids(runner.invoke(app, ["tasks", path, "--sample", "2", "--seed", "3", "--json"])) and len(sample) == 2
    table = runner.invoke(app, ["tasks", path])
    assert table.exit_code == 0 and "kernelbench/L3/5" in table.stdout and "4 tasks" in table.stdout


def test_kernel_env_tasks_refuses_a_source_it_cannot_read_with_the_reason(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    result = runner.invoke(app, ["tasks", str(path)])
    assert result.exit_code == 2
    assert "not a readable Parquet file" in result.stderr
