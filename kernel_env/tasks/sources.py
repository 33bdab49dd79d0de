"""Task records from data sets: JSONL, JSON and Parquet files in the shapes of the public sets.

One function turns rows into tasks, whatever file they came from, by the *shape* of the rows:

- **kernelbench**: the KernelBench export (``code``, ``level``, ``name``, ``problem_id``);
  ids ``kernelbench/L<level>/<problem_id>``, the same as a KernelBench checkout gives.
- **kernelbook**: KernelBook rows (``python_code`` with paired ``triton_code``, ``repo_name``,
  ``module_name``/``entry_point``, ``uuid``, ...); ids ``kernelbook/<uuid or row>``. The paired
  Triton code is kept in ``Task.metadata["triton_code"]``. KernelBook's PyTorch code names its
  class after the module and its ``get_init_inputs()`` returns ``[args, kwargs]``; a short
  adapter appended to the code makes it KernelBench-format (``Model``, positional init inputs).
- **ops6k**: CUDA-Agent-Ops-6K rows (``code``, ``ops``, ``data_source`` like ``torch#2``) and
  any other rows with a code column; ids ``ops6k/<row>`` (or the row's own ``id``/``name``).
  The synthesis output (``kernel_env.workloads.runs.synth``) is of this shape, with ``source: synthetic``
  and its provenance.

Reading never executes task code; rows are only parsed (``Task.check_source``). Parquet is
read with pyarrow; no data-set hub is contacted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kernel_env.tasks.task import Task, TaskError

CODE_COLUMNS = ("code", "pytorch_code", "python_code", "torch_code", "model_code", "module_code", "reference_code",
                "ref_code", "task_code", "source_code")
_ID_COLUMNS = ("id", "task_id", "uuid", "sample_key")
_NAME_COLUMNS = ("name", "module_name", "entry_point", "op_name", "problem_name")
_OPS_COLUMNS = ("ops", "operators", "op_list", "op_names", "data_source")
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
SHAPES = ("kernelbench", "kernelbook", "ops6k")


# --------------------------------------------------------------------------- reading rows


def read_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The rows of a JSONL, JSON (a list of objects) or Parquet file, each with where it came from
    (``file:line`` or ``file:row N``). Raises TaskError naming the file and line for a bad row."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TaskError(f"task source {path}: cannot read it: {exc.strerror or exc}") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskError(f"task source {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        out = []
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise TaskError(f"task {path.name}[{index}]: not a JSON object")
            out.append((f"{path.name}[{index}]", row))
        return out
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"task {where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TaskError(f"task {where}: not a JSON object")
        out.append((where, row))
    return out


def _read_parquet(path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"task source {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskError(f"task source {path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    return [(f"{path.name}:row {index}", row) for index, row in enumerate(rows)]


def record_files(folder: Path) -> list[Path]:
    """The JSONL/JSON/Parquet files under a folder (a data-set snapshot: ``data/train-00000-of-00001.parquet``),
    in name order so that row numbers, and the ids made from them, are stable."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in RECORD_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


# --------------------------------------------------------------------------- shapes


def detect_shape(columns: Iterable[str]) -> str:
    """kernelbench, kernelbook or ops6k, from the columns the rows have."""
    cols = set(columns)
    if "triton_code" in cols or ("python_code" in cols and cols & {"repo_name", "module_name", "entry_point"}):
        return "kernelbook"
    if {"level", "problem_id"} <= cols and "code" in cols:
        return "kernelbench"
    return "ops6k"


def tasks_from_records(rows: Sequence[tuple[str, dict[str, Any]]], *, origin: str, source: str | None = None,
                       shape: str | None = None, start: int = 0) -> list[Task]:
    """Tasks from rows (``(where, row)`` pairs as ``read_records`` gives them).

    ``shape`` (kernelbench, kernelbook, ops6k) is detected from the columns when not given;
    ``source`` overrides the task source (otherwise the row's ``source``, else the shape's name;
    rows with a code column but no Ops-6K column (``ops``, ``data_source``) take the file's stem).
    ``start`` numbers the rows (ids ``ops6k/<n>``) when several files make one source. A row
    without a code column raises TaskError naming the row, the columns looked for and the
    columns found."""
    if not rows:
        return []
    columns = {key for _, row in rows for key, value in row.items() if value is not None}  # Parquet nulls are absent
    shape = shape or detect_shape(columns)
    if shape not in SHAPES:
        raise TaskError(f"task source {origin}: unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    # Rows with code but nothing of Ops-6K's (ops, data_source) are a set of one's own: named after the file.
    fallback = shape if shape != "ops6k" or columns & set(_OPS_COLUMNS) else Path(origin).stem
    make = {"kernelbench": _kernelbench_task, "kernelbook": _kernelbook_task, "ops6k": _ops_task}[shape]
    tasks = []
    for number, (where, row) in enumerate(rows, start):
        task = make(where, row, number, source or row.get("source") or fallback)
        task.check_source()
        tasks.append(task)
    return tasks


def _code(where: str, row: dict, columns: Sequence[str]) -> str:
    for key in columns:
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    found = ", ".join(sorted(row)) or "none"
    raise TaskError(f"task {where}: no code field (a column named one of {', '.join(columns)}; the row has {found})")


def _first(row: dict, columns: Sequence[str]) -> Any:
    return next((row[key] for key in columns if row.get(key) not in (None, "")), None)


def _int_or_none(where: str, value: Any, column: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TaskError(f"task {where}: column {column} is {value!r}, not a number") from None


def _metadata(row: dict, used: Iterable[str]) -> dict:
    skip = set(used)
    meta = {k: v for k, v in row.items() if k not in skip and v is not None}
    if isinstance(meta.get("provenance"), str):  # Parquet output of kernel_env.workloads.runs.synth stores it as JSON text
        try:
            meta["provenance"] = json.loads(meta["provenance"])
        except json.JSONDecodeError:
            pass
    return meta


def _kernelbench_task(where: str, row: dict, number: int, source: str) -> Task:
    code = _code(where, row, ("code",))
    level = _int_or_none(where, row.get("level"), "level")
    problem_id = _int_or_none(where, row.get("problem_id"), "problem_id")
    if level is None or problem_id is None:
        raise TaskError(f"task {where}: a KernelBench row needs level and problem_id (got {row.get('level')!r}, "
                        f"{row.get('problem_id')!r})")
    name = re.sub(r"\.py$", "", str(row.get("name") or problem_id))
    name = re.sub(rf"^{problem_id}_", "", name)  # the export's names keep the file's "12_" prefix
    return Task(id=f"kernelbench/L{level}/{problem_id}", code=code, source=source, name=name,
                level=level, problem_id=problem_id,
                metadata=_metadata(row, ("code", "level", "problem_id", "name", "source")))


_KERNELBOOK_ADAPTER = '''

# --- kernel_env: KernelBench-format adapter for this KernelBook row ---------------------
{alias}_kernel_env_kernelbook_init_inputs = get_init_inputs


def get_init_inputs():
    """KernelBook gives [args, kwargs]; KernelBench wants positional constructor arguments."""
    init = _kernel_env_kernelbook_init_inputs()
    if len(init) == 2 and isinstance(init[0], (list, tuple)) and isinstance(init[1], dict):
        import inspect
        bound = inspect.signature(Model).bind(*init[0], **init[1])
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(f"keyword-only constructor arguments cannot be passed positionally: {{sorted(bound.kwargs)}}")
        return list(bound.args)
    return list(init)
'''


def kernelbook_code(python_code: str, class_name: str | None) -> str:
    """KernelBook's PyTorch code made KernelBench-format: ``Model`` names the module class (when the
    code has no ``Model``) and ``get_init_inputs()`` returns positional arguments. Text only; nothing runs."""
    defines_model = re.search(r"^(class\s+Model\b|Model\s*=)", python_code, re.M) is not None
    alias = "" if defines_model or not class_name else f"Model = {class_name}\n"
    return python_code.rstrip() + "\n" + _KERNELBOOK_ADAPTER.format(alias=alias)


def _kernelbook_task(where: str, row: dict, number: int, source: str) -> Task:
    python_code = _code(where, row, ("python_code", *CODE_COLUMNS))
    class_name = _first(row, ("entry_point", "module_name"))
    if class_name is not None and not re.fullmatch(r"[A-Za-z_]\w*", str(class_name)):
        class_name = None
    ident = _first(row, ("uuid", *_ID_COLUMNS))
    name = str(class_name or ident or number)
    suffix = str(ident) if ident is not None else str(number)
    used = ("python_code", "uuid", *_ID_COLUMNS, "source")
    metadata = _metadata(row, used)
    return Task(id=f"kernelbook/{suffix}", code=kernelbook_code(python_code, str(class_name) if class_name else None),
                source=source, name=name, metadata=metadata)


def _ops_task(where: str, row: dict, number: int, source: str) -> Task:
    code = _code(where, row, CODE_COLUMNS)
    task_source = source
    ident = _first(row, _ID_COLUMNS)
    name = _first(row, _NAME_COLUMNS)
    if name is None:
        ops = _first(row, ("ops", "operators", "op_list", "op_names"))
        name = "_".join(map(str, ops)) if isinstance(ops, list) and ops else str(ident if ident is not None else number)
    task_id = str(ident) if ident is not None else f"{task_source}/{_first(row, _NAME_COLUMNS) or number}"
    used = ("id", "task_id", "sample_key", "name", "level", "problem_id", "source", *CODE_COLUMNS)
    return Task(id=task_id, code=code, source=task_source, name=str(name),
                level=_int_or_none(where, row.get("level"), "level"),
                problem_id=_int_or_none(where, row.get("problem_id"), "problem_id"),
                metadata=_metadata(row, used))


# --------------------------------------------------------------------------- files and folders


def load_record_file(path: str | Path, *, source: str | None = None, shape: str | None = None) -> list[Task]:
    """Every task of one JSONL, JSON or Parquet file (the shape detected from its columns)."""
    path = Path(path)
    return tasks_from_records(read_records(path), origin=str(path), source=source, shape=shape)


def load_record_folder(folder: str | Path, *, source: str | None = None, shape: str | None = None) -> list[Task]:
    """Every task of the record files under a folder (a data-set snapshot with several shards or
    splits), numbered across files in name order."""
    folder = Path(folder)
    files = record_files(folder)
    if not files:
        raise TaskError(f"task source {folder}: no level1/ … folders and no .jsonl/.json/.parquet files; "
                        "is this a KernelBench checkout or a data-set folder?")
    tasks: list[Task] = []
    for path in files:
        rows = read_records(path)
        tasks += tasks_from_records(rows, origin=str(path), source=source, shape=shape, start=len(tasks))
    return tasks


def write_records(tasks: Sequence[Task], path: str | Path) -> Path:
    """Write tasks as records (JSONL, or Parquet by the suffix) that the loaders read back to the
    same tasks: id, source, name, level, problem_id, code, and each metadata key as a column.
    Written to a temporary file and renamed, so a reader never sees half a file."""
    path = Path(path)
    rows = []
    for task in tasks:
        record = {"id": task.id, "source": task.source, "name": task.name, "level": task.level,
                  "problem_id": task.problem_id, "code": task.code, **task.metadata}
        rows.append(record)
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = list(dict.fromkeys(key for row in rows for key in row))  # from_pylist would take the first row's only
        flat = [{k: (json.dumps(row[k]) if isinstance(row.get(k), dict) else row.get(k)) for k in columns} for row in rows]
        pq.write_table(pa.Table.from_pylist(flat), tmp)
    else:
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)
    return path
