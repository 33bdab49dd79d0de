"""Tasks: loaders, content hashes, and one clear error line for every malformed task.

Validation runs each task in a real probe process; the probes of this module run in parallel
(one module fixture) because each pays for importing torch.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import TINY_TASK
from kernel_env.resources import example_dir
from kernel_env.tasks import (
    Task,
    TaskError,
    TaskInfo,
    load_jsonl,
    load_kernelbench,
    load_task_file,
    load_tasks,
    resolve_task,
    validate_task,
)


def _kernelbench_tree(root: Path) -> Path:
    """A KernelBench-shaped checkout: level1/1_Foo.py, level1/2_Baz.py, level1/10_Qux.py, level2/12_Bar.py."""
    for level, stem in ((1, "1_Foo"), (1, "10_Qux"), (1, "2_Baz"), (2, "12_Bar")):
        folder = root / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.py").write_text(TINY_TASK.replace("relu", f"relu  # {stem}"))
    return root


# ----------------------------------------------------------------------------- loaders


def test_a_single_file_loads_as_one_task_named_after_the_file(tmp_path):
    path = tmp_path / "19_ReLU.py"
    path.write_text(TINY_TASK)
    task = load_task_file(path)
    assert task.id == "file/19_ReLU"
    assert (task.name, task.problem_id, task.level, task.source) == ("ReLU", 19, None, "file")
    assert task.code == TINY_TASK
    assert load_tasks(path) == [task]


def test_a_kernelbench_checkout_gives_level_and_problem_ids(tmp_path):
    tasks = load_tasks(_kernelbench_tree(tmp_path / "KernelBench"))
    assert [t.id for t in tasks] == ["kernelbench/L1/1", "kernelbench/L1/2", "kernelbench/L1/10", "kernelbench/L2/12"]
    bar = tasks[-1]
    assert (bar.source, bar.level, bar.problem_id, bar.name) == ("kernelbench", 2, 12, "Bar")
    assert tasks[0].name == "Foo"


def test_a_kernelbench_repository_root_finds_its_kernelbench_folder(tmp_path):
    _kernelbench_tree(tmp_path / "repo" / "KernelBench")
    assert [t.id for t in load_kernelbench(tmp_path / "repo", levels=[2])] == ["kernelbench/L2/12"]


def test_a_folder_without_levels_is_refused_with_a_hint(tmp_path):
    with pytest.raises(TaskError, match="no level1/ .* KernelBench checkout"):
        load_kernelbench(tmp_path)


def test_resolve_task_finds_one_kernelbench_problem_by_id(tmp_path):
    root = _kernelbench_tree(tmp_path / "kb")
    task = resolve_task("kernelbench/L2/12", kernelbench_root=root)
    assert task.id == "kernelbench/L2/12" and task.name == "Bar"
    with pytest.raises(TaskError, match="kernelbench/L2/99: no such problem"):
        resolve_task("kernelbench/L2/99", kernelbench_root=root)


def test_jsonl_records_become_tasks_with_their_fields(tmp_path):
    path = tmp_path / "ops6k.jsonl"
    records = [
        {"id": "ops6k/7", "name": "relu_scale", "level": 1, "code": TINY_TASK, "ops": ["relu", "mul"]},
        {"name": "second", "pytorch_code": TINY_TASK.replace("2.0", "3.0")},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    first, second = load_jsonl(path)
    assert (first.id, first.name, first.level, first.source) == ("ops6k/7", "relu_scale", 1, "ops6k")
    assert first.metadata == {"ops": ["relu", "mul"]}
    assert second.id == "ops6k/second" and second.level is None and "3.0" in second.code
    assert [t.id for t in load_tasks(path)] == ["ops6k/7", "ops6k/second"]
    assert resolve_task(f"{path}#second").id == "ops6k/second"


def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"code": TINY_TASK}) + "\n{not json\n")
    with pytest.raises(TaskError, match=r"^task broken.jsonl:2: not valid JSON"):
        load_jsonl(path)
    path.write_text(json.dumps({"id": "x", "text": "no code here"}) + "\n")
    with pytest.raises(TaskError, match=r"^task broken.jsonl:1: no code field"):
        load_jsonl(path)


def test_the_bundled_examples_load_by_name():
    (relu_add,) = [t for t in load_tasks("examples") if t.id == "example/relu_add"]
    assert resolve_task("example/relu_add") == relu_add
    with pytest.raises(TaskError, match=r"no such bundled example \(known: .*relu_add"):
        resolve_task("example/does_not_exist")


def test_an_unknown_source_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a task")
    with pytest.raises(TaskError, match="not a .py file, a .jsonl file, a KernelBench folder or 'examples'"):
        load_tasks(tmp_path / "notes.txt")


def test_a_missing_source_or_task_file_says_no_such_file(tmp_path):
    with pytest.raises(TaskError, match=r"^task source .*nothing_here.txt: no such file or folder$"):
        load_tasks(tmp_path / "nothing_here.txt")
    with pytest.raises(TaskError, match=r"^task nope.py: no such file \(a task is example/NAME, a .py file"):
        resolve_task("nope.py")
    with pytest.raises(TaskError, match=r"^task source .*gone.jsonl: no such file or folder$"):
        resolve_task(f"{tmp_path / 'gone.jsonl'}#some-id")


def test_a_task_file_resolves_as_the_loaders_read_it_even_under_examples(monkeypatch):
    """`tasks examples/relu_add/task.py` and `run-task examples/relu_add/task.py` name one task:
    an existing file is a file, whatever its path starts with."""
    monkeypatch.chdir(example_dir("relu_add").parent.parent)
    (listed,) = load_tasks("examples/relu_add/task.py")
    assert resolve_task("examples/relu_add/task.py") == listed
    assert (listed.id, listed.name) == ("file/relu_add", "relu_add")  # a task.py is named after its folder
    assert listed.code == resolve_task("example/relu_add").code
    # Named from elsewhere, the bundled example's path is still the bundled example.
    monkeypatch.chdir("/")
    assert resolve_task("examples/relu_add/task.py").id == "example/relu_add"
    if len(bundled := load_tasks("examples")) == 1:  # 'examples' names the bundled set wherever one stands
        assert resolve_task("examples") == bundled[0]
    assert resolve_task("example/relu_add/").id == "example/relu_add"


# ----------------------------------------------------------------------------- hashes


def test_the_content_hash_is_stable_and_depends_only_on_the_code(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(TINY_TASK)
    b.write_text(TINY_TASK)
    ha = load_task_file(a).hash
    assert len(ha) == 16 and int(ha, 16) >= 0
    assert load_task_file(a).hash == ha == load_task_file(b).hash  # same code, other file and id
    assert Task(id="x", code=TINY_TASK).hash == ha


def test_the_content_hash_changes_when_the_code_changes(tmp_path):
    assert Task(id="x", code=TINY_TASK).hash != Task(id="x", code=TINY_TASK.replace("8, 16", "8, 17")).hash
    assert Task(id="x", code=TINY_TASK).hash != Task(id="x", code=TINY_TASK + "\n").hash


# ----------------------------------------------------------------------------- validation

_HEAD = "import torch\nimport torch.nn as nn\n"
MALFORMED = {
    "loops_for_ever_at_import": _HEAD + "while True:\n    pass\n" + TINY_TASK,  # first: it is the slowest
    "get_inputs_raises": TINY_TASK.replace("    return [torch.randn(8, 16)]", "    raise ValueError('no inputs today')"),
    "forward_returns_a_string": TINY_TASK.replace("return torch.relu(x) * self.scale", "return 'not a tensor'"),
    "reads_a_file_at_import": _HEAD + "SECRET = open('/etc/hostname').read()\n" + TINY_TASK,
    "reads_a_file_in_get_inputs": TINY_TASK.replace("    return [torch.randn(8, 16)]", "    open('/etc/passwd')\n    return [torch.randn(8, 16)]"),
    "opens_a_socket_at_import": _HEAD + "import socket\nsocket.create_connection(('127.0.0.1', 9))\n" + TINY_TASK,
    "uses_urllib_at_import": _HEAD + "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/weights')\n" + TINY_TASK,
    "starts_a_subprocess_at_import": _HEAD + "import subprocess\nsubprocess.run(['id'])\n" + TINY_TASK,
}
PROBE_TIMEOUT_S = {"loops_for_ever_at_import": 5.0}


@pytest.fixture(scope="module")
def probe_results() -> dict[str, TaskInfo | TaskError]:
    """validate_task on every task below, run concurrently (each is its own probe process)."""
    tasks = {name: Task(id=f"bad/{name}", code=code) for name, code in MALFORMED.items()}
    tasks["valid_tiny_task"] = Task(id="good/tiny", code=TINY_TASK)
    tasks["valid_bundled_example"] = resolve_task("example/relu_add")

    def probe(name: str):
        try:
            return validate_task(tasks[name], timeout=PROBE_TIMEOUT_S.get(name, 120.0))
        except TaskError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(tasks, pool.map(probe, tasks)))


def _error_line(results: dict, name: str) -> str:
    result = results[name]
    assert isinstance(result, TaskError), f"{name} was accepted: {result}"
    message = str(result)
    assert "\n" not in message, f"not one line: {message!r}"
    assert message.startswith(f"task bad/{name}: "), message
    assert "Traceback" not in message
    return message


def test_a_valid_task_reports_its_input_and_output_signatures(probe_results):
    info = probe_results["valid_tiny_task"]
    assert isinstance(info, TaskInfo), info
    assert info.inputs == [{"shape": [8, 16], "dtype": "float32"}]
    assert info.outputs == [{"shape": [8, 16], "dtype": "float32"}]
    assert info.init_inputs == ["float"]


def test_the_bundled_example_validates(probe_results):
    info = probe_results["valid_bundled_example"]
    assert isinstance(info, TaskInfo), info
    x, y = info.inputs  # relu(x + y): two float32 vectors of one shape, and one output like them
    assert x == y == info.outputs[0] and x["dtype"] == "float32" and len(x["shape"]) == 1


def test_a_syntax_error_is_one_line_with_its_line_number():
    code = TINY_TASK + "\ndef broken(:\n    pass\n"
    with pytest.raises(TaskError) as caught:
        validate_task(Task(id="bad/syntax", code=code))
    assert str(caught.value) == f"task bad/syntax: syntax error at line {TINY_TASK.count(chr(10)) + 2}: invalid syntax"


def test_a_task_without_model_is_named_and_told_what_is_missing():
    code = TINY_TASK.replace("class Model(", "class Modle(")
    with pytest.raises(TaskError) as caught:
        validate_task(Task(id="bad/no_model", code=code))
    assert str(caught.value).startswith("task bad/no_model: does not define Model")


def test_get_inputs_raising_names_the_exception_and_its_line(probe_results):
    message = _error_line(probe_results, "get_inputs_raises")
    line = MALFORMED["get_inputs_raises"].splitlines().index("    raise ValueError('no inputs today')") + 1
    assert message == f"task bad/get_inputs_raises: get_inputs() raised ValueError: no inputs today (line {line} of the task)"


def test_a_non_tensor_output_is_refused(probe_results):
    message = _error_line(probe_results, "forward_returns_a_string")
    assert message == "task bad/forward_returns_a_string: Model.forward: output 0 is a str, not a tensor"


def test_a_task_that_reads_a_file_at_import_is_refused_with_the_line(probe_results):
    assert _error_line(probe_results, "reads_a_file_at_import") == (
        "task bad/reads_a_file_at_import: at import tried to open /etc/hostname "
        "(tasks must not read or write files) (line 3 of the task)"
    )


def test_a_task_that_reads_a_file_while_running_is_refused(probe_results):
    message = _error_line(probe_results, "reads_a_file_in_get_inputs")
    assert message.startswith("task bad/reads_a_file_in_get_inputs: get_inputs() tried to open /etc/passwd")


@pytest.mark.parametrize("name", ["opens_a_socket_at_import", "uses_urllib_at_import"])
def test_a_task_that_uses_the_network_at_import_is_refused_with_the_line(probe_results, name):
    # urllib wraps the refusal in a URLError; the report names the refusal, not the wrapper.
    assert _error_line(probe_results, name) == (
        f"task bad/{name}: at import tried to use the network (tasks must be self-contained) (line 4 of the task)"
    )


def test_a_task_that_starts_a_process_at_import_is_refused(probe_results):
    assert _error_line(probe_results, "starts_a_subprocess_at_import") == (
        "task bad/starts_a_subprocess_at_import: at import tried to start a process "
        "(tasks must be self-contained) (line 4 of the task)"
    )


def test_a_task_that_never_finishes_importing_times_out(probe_results):
    message = _error_line(probe_results, "loops_for_ever_at_import")
    assert message == "task bad/loops_for_ever_at_import: running Model/get_inputs took longer than 5s"
