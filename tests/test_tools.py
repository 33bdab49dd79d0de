"""The agent tools, run against a real sandbox of each backend (local bubblewrap, docker) on a real workspace."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import pytest

from kernel_env.sandbox import make_sandbox
from kernel_env.tasks import resolve_task
from kernel_env.tools import (
    ALL_TOOL_NAMES,
    DEFAULT_MAX_OUTPUT_CHARS,
    ToolBox,
    ToolCall,
    ToolResult,
    parse_tool_calls,
    tool_schemas,
)
from kernel_env.workspace import Workspace


@pytest.fixture
def ws(tmp_path):
    workspace = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path)
    yield workspace
    workspace.destroy()


@pytest.fixture
def sandbox(ws, backend):
    """A real sandbox of each backend (local: bubblewrap where the host allows it, the same server
    unisolated otherwise; docker: a container)."""
    with make_sandbox(backend, ws) as sb:
        yield sb


@pytest.fixture
def box(sandbox):
    return ToolBox(sandbox)


def call(box: ToolBox, name: str, **arguments) -> ToolResult:
    return box.run(ToolCall(name=name, arguments=arguments))


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.output
    return result.output


def err(result: ToolResult) -> str:
    assert result.is_error, result.output
    return result.output


def sh(box: ToolBox, command: str) -> str:
    return ok(call(box, "Bash", command=command))


# --------------------------------------------------------------------------- schemas


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _check_object_schema(schema: dict, where: str) -> None:
    assert schema["type"] == "object", where
    assert isinstance(schema["properties"], dict), where
    assert schema["additionalProperties"] is False, where
    assert isinstance(schema["required"], list), where
    assert set(schema["required"]) <= set(schema["properties"]), where
    for name, prop in schema["properties"].items():
        assert isinstance(prop.get("description"), str) and prop["description"], f"{where}.{name} has no description"
        assert "type" in prop, f"{where}.{name} has no type"
        if "enum" in prop:
            assert prop["type"] == "string" and all(isinstance(v, str) for v in prop["enum"]), f"{where}.{name}"
        if prop["type"] == "array":
            items = prop["items"]
            if items.get("type") == "object":
                _check_object_schema(items, f"{where}.{name}[]")
        assert "default" not in prop or prop["default"] is not None, f"{where}.{name}"


def test_schemas_are_valid_openai_function_specs():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(ALL_TOOL_NAMES)
    assert set(ALL_TOOL_NAMES) == {"Bash", "Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "TodoWrite",
                                   "BashOutput", "KillBash", "NotebookEdit", "Finish"}
    for spec in schemas:
        assert set(spec) == {"type", "function"} and spec["type"] == "function"
        fn = spec["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert isinstance(fn["description"], str) and 20 < len(fn["description"]) < 2000
        _check_object_schema(fn["parameters"], fn["name"])
        for node in _walk(fn["parameters"]):
            assert "title" not in node and "$ref" not in node and "$defs" not in node and "anyOf" not in node
        json.loads(json.dumps(spec))  # plain JSON


@pytest.mark.parametrize(("tool", "required"), [
    ("Bash", {"command"}), ("Read", {"file_path"}), ("Write", {"file_path", "content"}),
    ("Edit", {"file_path", "old_string", "new_string"}), ("MultiEdit", {"file_path", "edits"}),
    ("Glob", {"pattern"}), ("Grep", {"pattern"}), ("TodoWrite", {"todos"}), ("BashOutput", {"bash_id"}),
    ("KillBash", {"shell_id"}), ("NotebookEdit", {"notebook_path"}),
])
def test_schemas_use_claude_code_argument_names(tool, required):
    (spec,) = tool_schemas([tool])
    params = spec["function"]["parameters"]
    assert set(params["required"]) == required
    expected = {
        "Bash": {"command", "timeout", "description", "run_in_background"},
        "Read": {"file_path", "offset", "limit"},
        "Grep": {"pattern", "path", "glob", "type", "output_mode", "-i", "-n", "-A", "-B", "-C", "multiline", "head_limit"},
        "NotebookEdit": {"notebook_path", "cell_id", "new_source", "cell_type", "edit_mode"},
    }.get(tool)
    if expected:
        assert set(params["properties"]) == expected


def test_schema_enums_are_enums():
    (grep,) = tool_schemas(["Grep"])
    assert grep["function"]["parameters"]["properties"]["output_mode"]["enum"] == ["content", "files_with_matches", "count"]
    (todo,) = tool_schemas(["TodoWrite"])
    status = todo["function"]["parameters"]["properties"]["todos"]["items"]["properties"]["status"]
    assert status["enum"] == ["pending", "in_progress", "completed"]


def test_tool_set_is_configurable(sandbox):
    box = ToolBox(sandbox, ["Read", "Bash"])
    assert [s["function"]["name"] for s in box.schemas()] == ["Bash", "Read"]
    out = err(call(box, "Write", file_path="kernels/a.cpp", content="x"))
    assert "unknown tool 'Write'" in out and "Bash, Read" in out
    with pytest.raises(ValueError, match="unknown tool 'Frobnicate'"):
        ToolBox(sandbox, ["Frobnicate"])


# --------------------------------------------------------------------------- parsing


def test_parser_accepts_dicts_json_lists_and_openai_calls():
    openai = {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "model.py"}'}}
    calls = parse_tool_calls([
        {"name": "Bash", "arguments": {"command": "ls"}},
        json.dumps({"name": "Glob", "arguments": {"pattern": "*"}}),
        openai,
        {"type": "tool_use", "id": "toolu_1", "name": "Grep", "input": {"pattern": "x"}},
    ])
    assert [(c.name, c.arguments, c.id, c.error) for c in calls] == [
        ("Bash", {"command": "ls"}, None, None),
        ("Glob", {"pattern": "*"}, None, None),
        ("Read", {"file_path": "model.py"}, "call_1", None),
        ("Grep", {"pattern": "x"}, "toolu_1", None),
    ]
    (fenced,) = parse_tool_calls('```json\n{"name": "Bash", "arguments": {"command": "pwd"}}\n```')
    assert fenced.name == "Bash" and fenced.error is None
    assert [c.name for c in parse_tool_calls(json.dumps([{"name": "A"}, {"name": "B"}]))] == ["A", "B"]


@pytest.mark.parametrize(("action", "kind", "message"), [
    (None, "parse", "empty"),
    (b"\xff\xfe junk", "parse", "binary"),
    ("not json", "parse", "not valid JSON"),
    ("", "parse", "empty string"),
    (42, "parse", "not a tool call"),
    ([], "parse", "empty list"),
    ({"arguments": {}}, "parse", "no tool name"),
    ({"name": 7}, "parse", "no tool name"),
    ({"name": "Read", "arguments": "{broken"}, "parse", "not valid JSON"),
    ({"name": "Read", "arguments": [1, 2]}, "parse", "must be a JSON object"),
    ({"name": "Frobnicate", "arguments": {}}, "unknown_tool", "unknown tool 'Frobnicate'"),
    ({"name": "Read", "arguments": {"file_path": 123}}, "invalid_arguments", "'file_path': Input should be a valid string"),
    ({"name": "Read", "arguments": {"file_path": "model.py", "offset": "abc"}}, "invalid_arguments", "'offset'"),
    ({"name": "Bash", "arguments": {"command": "ls", "timeout": 10_000_000}}, "invalid_arguments", "'timeout'"),
    ({"name": "Read", "arguments": {}}, "invalid_arguments", "missing required argument 'file_path'"),
    ({"name": "Edit", "arguments": {"file_path": "kernels/a.cpp"}}, "invalid_arguments", "missing required argument 'old_string'"),
    ({"name": "Read", "arguments": {"path": "model.py"}}, "invalid_arguments", "unexpected argument 'path'"),
    ({"name": "TodoWrite", "arguments": {"todos": [{"content": "x", "status": "done"}]}}, "invalid_arguments", "todos.0.status"),
], ids=["none", "binary", "not-json", "empty-string", "number", "empty-list", "no-name", "name-not-str",
        "arguments-not-json", "arguments-not-object", "unknown-tool", "wrong-type", "wrong-type-int",
        "out-of-range", "missing-arg", "missing-nested-arg", "unexpected-arg", "bad-enum"])
def test_malformed_tool_calls_return_errors(box, action, kind, message):
    results = box.run_all(action)
    assert len(results) == 1
    (result,) = results
    assert result.is_error and result.invalid_call and result.data["error_kind"] == kind
    assert message in result.output
    if kind == "invalid_arguments":
        assert "takes:" in result.output  # the message lists the tool's arguments


def test_a_failing_valid_call_is_not_an_invalid_call(box):
    result = call(box, "Read", file_path="kernels/missing.cu")
    assert result.is_error and not result.invalid_call and result.data["error_kind"] == "tool_error"
    assert not call(box, "Bash", command="exit 1").invalid_call


def test_run_never_raises_on_garbage(box):
    for garbage in (None, b"\x00\x01", object(), {"function": "x"}, [[{"name": "Bash"}]], float("nan")):
        for result in box.run_all(garbage):
            assert result.is_error
        assert box.run(garbage).is_error


def test_run_all_runs_every_call_in_order_and_keeps_ids(box):
    results = box.run_all([
        {"id": "a", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "echo one"}'}},
        {"id": "b", "type": "function", "function": {"name": "Nope", "arguments": "{}"}},
        {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "echo two"}'}},
    ])
    assert [(r.call_id, r.tool, r.is_error) for r in results] == [("a", "Bash", False), ("b", "Nope", True), ("c", "Bash", False)]
    assert results[0].output == "one" and results[2].output == "two"


def test_tool_names_match_case_insensitively(box):
    assert ok(call(box, "bash", command="echo hi")) == "hi"


def test_unexpected_internal_error_becomes_error_result(box, monkeypatch, caplog):
    from kernel_env.tools.files import Read

    def boom(self, args, ctx):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(Read, "run", boom)
    with caplog.at_level(logging.ERROR, logger="kernel_env.tools"):
        result = call(box, "Read", file_path="model.py")
    assert result.is_error and "Read" in result.output and "internal error" in result.output
    assert "kaboom" not in result.output  # the traceback is for the log, not the model
    assert any("kaboom" in (r.exc_text or "") or (r.exc_info and "kaboom" in str(r.exc_info[1])) for r in caplog.records)


def test_async_run(box):
    result = asyncio.run(box.arun({"name": "Bash", "arguments": {"command": "echo async"}}))
    assert ok(result) == "async"


# --------------------------------------------------------------------------- paths and protection


@pytest.mark.parametrize("tool", ["Read", "Write", "Edit"])
@pytest.mark.parametrize("path", ["../outside.txt", "kernels/../../outside.txt", "/etc/passwd", "/tmp/x", "/workspacefoo/x"])
def test_path_outside_workspace_is_refused(box, ws, sandbox, tool, path):
    path = path.replace("/workspace", sandbox.workdir)
    args = {"file_path": path, "content": "x", "old_string": "a", "new_string": "b"}
    keys = {"Read": ["file_path"], "Write": ["file_path", "content"], "Edit": ["file_path", "old_string", "new_string"]}[tool]
    out = err(call(box, tool, **{k: args[k] for k in keys}))
    assert "outside the workspace" in out or "leaves the workspace" in out
    assert not (ws.root / "outside.txt").exists()


def test_absolute_path_under_workspace_is_accepted(box, sandbox):
    ok(call(box, "Write", file_path=f"{sandbox.workdir}/kernels/abs.cpp", content="int x;\n"))
    assert "int x;" in ok(call(box, "Read", file_path="kernels/abs.cpp"))


@pytest.mark.parametrize("path", ["model.py", "SKILL.md", "binding.cpp", "binding_registry.h", "utils/compile.sh", "utils/new_file.py", "./model.py"])
def test_write_to_protected_file_is_refused(box, ws, path):
    before = ws.hash_protected()
    call(box, "Read", file_path=path)
    out = err(call(box, "Write", file_path=path, content="hacked"))
    assert "protected" in out and "read-only" in out and "kernels/" in out and "model_new.py" in out
    out = err(call(box, "Edit", file_path=path, old_string="import", new_string="hacked"))
    assert "protected" in out
    assert ws.hash_protected() == before and ws.tampered_files() == []


def test_symlink_out_of_workspace_is_not_followed(box, ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    sh(box, f"ln -s {secret} kernels/host_link && ln -s /etc/hostname kernels/etc_link && ln -s / kernels/root_link")
    for link in ("kernels/host_link", "kernels/etc_link"):
        assert "outside the workspace" in err(call(box, "Read", file_path=link))
        assert "outside the workspace" in err(call(box, "Write", file_path=link, content="pwned"))
        assert "outside the workspace" in err(call(box, "Edit", file_path=link, old_string="", new_string="pwned"))
    assert "outside the workspace" in err(call(box, "Write", file_path="kernels/root_link/tmp/pwned", content="x"))
    assert secret.read_text() == "host secret\n"
    glob = ok(call(box, "Glob", pattern="kernels/*"))
    assert "host_link" not in glob and "etc_link" not in glob


def test_glob_does_not_follow_symlinked_directories(box):
    sh(box, "ln -s .. kernels/up_link && ln -s / kernels/root_link && echo x > kernels/real.cu")
    assert ok(call(box, "Glob", pattern="**/*.cu")).splitlines() == ["kernels/real.cu"]


def test_symlink_to_protected_file_is_not_writable(box, ws):
    sh(box, "ln -s ../model.py kernels/model_link.py")
    ok(call(box, "Read", file_path="kernels/model_link.py"))
    out = err(call(box, "Write", file_path="kernels/model_link.py", content="hacked"))
    assert "protected" in out or "read-only" in out.lower()
    assert ws.tampered_files() == []


# --------------------------------------------------------------------------- Read


def test_read_numbers_lines_like_cat_n(box, ws):
    out = ok(call(box, "Read", file_path="model.py"))
    lines = ws.task.code.splitlines()
    assert out.splitlines()[0] == f"     1\t{lines[0]}"
    assert out.splitlines()[len(lines) - 1] == f"{len(lines):>6}\t{lines[-1]}"
    assert len(out.splitlines()) == len(lines)  # a whole file has no trailer


def test_read_offset_and_limit(box):
    ok(call(box, "Write", file_path="kernels/long.txt", content="".join(f"l{i}\n" for i in range(1, 3001))))
    out = ok(call(box, "Read", file_path="kernels/long.txt", offset=10, limit=3))
    assert out.splitlines() == ["    10\tl10", "    11\tl11", "    12\tl12", "[showing lines 10-12 of 3000; continue with offset=13]"]
    default = ok(call(box, "Read", file_path="kernels/long.txt")).splitlines()
    assert default[0] == "     1\tl1" and default[1999] == "  2000\tl2000"
    assert default[-1] == "[showing lines 1-2000 of 3000; continue with offset=2001]"
    assert "past the end" in err(call(box, "Read", file_path="kernels/long.txt", offset=5000))


def test_read_cuts_very_long_lines(box):
    ok(call(box, "Write", file_path="kernels/wide.txt", content="a" * 5000 + "\nshort\n"))
    out = ok(call(box, "Read", file_path="kernels/wide.txt"))
    first, second = out.splitlines()
    assert first.startswith("     1\t" + "a" * 2000) and "a" * 2001 not in first
    assert "3000 more characters" in first
    assert second == "     2\tshort"


def test_read_empty_file_says_so(box):
    sh(box, "touch kernels/empty.cu")
    assert "empty" in ok(call(box, "Read", file_path="kernels/empty.cu"))


def test_read_binary_file_is_refused(box):
    sh(box, "printf 'ELF\\000\\001\\002' > kernels/blob.so")
    assert "binary" in err(call(box, "Read", file_path="kernels/blob.so"))


def test_read_missing_file_and_directory_are_errors(box):
    assert "does not exist" in err(call(box, "Read", file_path="kernels/nope.cu"))
    assert "directory" in err(call(box, "Read", file_path="kernels"))


# --------------------------------------------------------------------------- Write


def test_write_creates_file_and_parent_directories(box, ws):
    out = ok(call(box, "Write", file_path="kernels/sub/dir/k.cpp", content="int k;\n"))
    assert "Created kernels/sub/dir/k.cpp" in out
    assert (ws.path / "kernels/sub/dir/k.cpp").read_text() == "int k;\n"


def test_write_requires_prior_read_of_existing_file(box, ws):
    out = err(call(box, "Write", file_path="model_new.py", content="x = 1\n"))
    assert "Read it first" in out
    original = (ws.path / "model_new.py").read_text()
    assert original != "x = 1\n"
    ok(call(box, "Read", file_path="model_new.py"))
    assert "Overwrote model_new.py" in ok(call(box, "Write", file_path="model_new.py", content="x = 1\n"))
    assert (ws.path / "model_new.py").read_text() == "x = 1\n"


def test_write_may_overwrite_a_file_it_created(box):
    ok(call(box, "Write", file_path="kernels/mine.cpp", content="v1\n"))
    ok(call(box, "Write", file_path="kernels/mine.cpp", content="v2\n"))
    assert "v2" in ok(call(box, "Read", file_path="kernels/mine.cpp"))


def test_write_after_file_changed_since_read_requires_reread(box):
    ok(call(box, "Write", file_path="kernels/k.cpp", content="v1\n"))
    sh(box, "sleep 0.02; echo changed-by-shell >> kernels/k.cpp")
    assert "changed since you last read it" in err(call(box, "Write", file_path="kernels/k.cpp", content="v2\n"))
    ok(call(box, "Read", file_path="kernels/k.cpp"))
    ok(call(box, "Write", file_path="kernels/k.cpp", content="v2\n"))


# --------------------------------------------------------------------------- Edit / MultiEdit


def test_edit_replaces_unique_match_and_reports_count(box, ws):
    ok(call(box, "Write", file_path="kernels/k.cu", content="int a = 1;\nint b = 2;\n"))
    out = ok(call(box, "Edit", file_path="kernels/k.cu", old_string="int b = 2;", new_string="int b = 3;"))
    assert "replaced 1 occurrence" in out and "     2\tint b = 3;" in out
    assert (ws.path / "kernels/k.cu").read_text() == "int a = 1;\nint b = 3;\n"


def test_edit_refuses_ambiguous_match(box, ws):
    ok(call(box, "Write", file_path="kernels/k.cu", content="x = 0;\nx = 0;\n"))
    out = err(call(box, "Edit", file_path="kernels/k.cu", old_string="x = 0;", new_string="x = 1;"))
    assert "2 times" in out and "replace_all" in out
    assert (ws.path / "kernels/k.cu").read_text() == "x = 0;\nx = 0;\n"
    out = ok(call(box, "Edit", file_path="kernels/k.cu", old_string="x = 0;", new_string="x = 1;", replace_all=True))
    assert "replaced 2 occurrences" in out
    assert (ws.path / "kernels/k.cu").read_text() == "x = 1;\nx = 1;\n"


def test_edit_refuses_identical_strings_and_missing_text(box):
    ok(call(box, "Write", file_path="kernels/k.cu", content="alpha\nbeta\n"))
    assert "identical" in err(call(box, "Edit", file_path="kernels/k.cu", old_string="alpha", new_string="alpha"))
    assert "not found" in err(call(box, "Edit", file_path="kernels/k.cu", old_string="gamma", new_string="delta"))
    out = err(call(box, "Edit", file_path="kernels/k.cu", old_string="     2\tbeta", new_string="BETA"))
    assert "line-number" in out
    assert "does not exist" in err(call(box, "Edit", file_path="kernels/none.cu", old_string="a", new_string="b"))


def test_edit_with_empty_old_string_creates_a_file(box, ws):
    ok(call(box, "Edit", file_path="kernels/new.cu", old_string="", new_string="// new\n"))
    assert (ws.path / "kernels/new.cu").read_text() == "// new\n"
    assert "not empty" in err(call(box, "Edit", file_path="kernels/new.cu", old_string="", new_string="again"))


def test_multiedit_applies_edits_in_order(box, ws):
    ok(call(box, "Write", file_path="kernels/k.cu", content="a b c\n"))
    out = ok(call(box, "MultiEdit", file_path="kernels/k.cu", edits=[
        {"old_string": "a", "new_string": "x"},
        {"old_string": "x b", "new_string": "y"},  # sees the first edit's result
        {"old_string": "c", "new_string": "z"},
    ]))
    assert "applied 3 edits" in out
    assert (ws.path / "kernels/k.cu").read_text() == "y z\n"


def test_multiedit_is_atomic(box, ws):
    ok(call(box, "Write", file_path="kernels/k.cu", content="one two two\n"))
    out = err(call(box, "MultiEdit", file_path="kernels/k.cu", edits=[
        {"old_string": "one", "new_string": "1"},
        {"old_string": "two", "new_string": "2"},  # ambiguous
        {"old_string": "three", "new_string": "3"},
    ]))
    assert "edits[1]" in out and "2 times" in out and "No edits were applied" in out
    assert (ws.path / "kernels/k.cu").read_text() == "one two two\n"


def test_multiedit_can_create_a_file(box, ws):
    ok(call(box, "MultiEdit", file_path="kernels/fresh.cu", edits=[
        {"old_string": "", "new_string": "int a;\n"}, {"old_string": "a", "new_string": "b"},
    ]))
    assert (ws.path / "kernels/fresh.cu").read_text() == "int b;\n"


# --------------------------------------------------------------------------- Glob


def test_glob_lists_newest_first(box):
    sh(box, "mkdir -p kernels/deep/er && for f in old mid new; do echo $f > kernels/deep/er/$f.cu; done"
            " && touch -d '2020-01-01' kernels/deep/er/old.cu && touch -d '2021-01-01' kernels/deep/er/mid.cu")
    out = ok(call(box, "Glob", pattern="**/*.cu"))
    assert out.splitlines() == ["kernels/deep/er/new.cu", "kernels/deep/er/mid.cu", "kernels/deep/er/old.cu"]
    assert ok(call(box, "Glob", pattern="*.cu", path="kernels/deep/er")).splitlines()[0] == "kernels/deep/er/new.cu"
    assert "No files match" in ok(call(box, "Glob", pattern="**/*.nothing"))


def test_glob_caps_results_with_count(box):
    sh(box, "mkdir -p kernels/many && for i in $(seq 1 150); do : > kernels/many/f$i.h; done")
    result = call(box, "Glob", pattern="kernels/many/*.h")
    lines = ok(result).splitlines()
    assert len(lines) == 101 and "100 newest of 150" in lines[-1]
    assert result.data["count"] == 150


# --------------------------------------------------------------------------- Grep


@pytest.fixture
def sources(box):
    ok(call(box, "Write", file_path="kernels/add.cu", content="// header\n__global__ void add_kernel() {}\n// middle\nvoid launch_add() {}\n// footer\n"))
    ok(call(box, "Write", file_path="kernels/add_binding.cpp", content="#include <torch/types.h>\nvoid add_binding() { launch_add(); }\n"))
    ok(call(box, "Write", file_path="kernels/notes.txt", content="ADD notes\nadd more\n--verbose flag\n"))


def test_grep_lists_files_with_matches_by_default(box, sources):
    out = ok(call(box, "Grep", pattern="launch_add"))
    assert out.splitlines() == ["Found 2 files:", "kernels/add.cu", "kernels/add_binding.cpp"]


def test_grep_content_with_context_lines(box, sources):
    out = ok(call(box, "Grep", pattern="__global__", output_mode="content", **{"-C": 1}))
    assert out.splitlines() == ["kernels/add.cu-1-// header", "kernels/add.cu:2:__global__ void add_kernel() {}", "kernels/add.cu-3-// middle"]
    out = ok(call(box, "Grep", pattern="__global__", output_mode="content", **{"-A": 2, "-n": False}))
    assert out.splitlines() == ["kernels/add.cu:__global__ void add_kernel() {}", "kernels/add.cu-// middle", "kernels/add.cu-void launch_add() {}"]


def test_grep_type_and_glob_filters(box, sources):
    assert ok(call(box, "Grep", pattern="add", type="cuda")).splitlines()[1:] == ["kernels/add.cu"]
    assert ok(call(box, "Grep", pattern="add", type="cpp", path="kernels")).splitlines()[1:] == ["kernels/add_binding.cpp"]
    assert ok(call(box, "Grep", pattern="add", glob="*.{cu,txt}")).splitlines()[1:] == ["kernels/add.cu", "kernels/notes.txt"]
    assert "unrecognized file type" in err(call(box, "Grep", pattern="add", type="klingon")).lower()


def test_grep_count_case_and_head_limit(box, sources):
    out = ok(call(box, "Grep", pattern="add", path="kernels/notes.txt", output_mode="count", **{"-i": True}))
    assert out.splitlines()[0] == "kernels/notes.txt:2"
    out = ok(call(box, "Grep", pattern="add", path="kernels/notes.txt", output_mode="count"))
    assert out.splitlines()[0] == "kernels/notes.txt:1"
    out = ok(call(box, "Grep", pattern="add", output_mode="content", head_limit=2))
    assert len(out.splitlines()) == 3 and "head_limit" in out.splitlines()[-1]


def test_grep_multiline(box, sources):
    assert ok(call(box, "Grep", pattern="header.*__global__")).startswith("No matches")
    assert "kernels/add.cu" in ok(call(box, "Grep", pattern="header.*__global__", multiline=True))


def test_grep_pattern_is_not_interpreted_by_the_shell(box, ws, sources):
    for pattern in ["$(touch pwned)", "'; touch pwned; '", "`touch pwned`", "-e touch"]:
        result = call(box, "Grep", pattern=pattern)
        assert "No matches" in result.output or result.is_error
    assert not (ws.path / "pwned").exists()
    assert "kernels/notes.txt" in ok(call(box, "Grep", pattern="--verbose"))  # leading dash is a pattern, not a flag


def test_grep_leaves_the_shell_where_it_was(box, sandbox, sources):
    sh(box, "cd kernels && export KEEP=1")
    ok(call(box, "Grep", pattern="add"))
    assert sh(box, "pwd; echo $KEEP").splitlines() == [f"{sandbox.workdir}/kernels", "1"]


def test_grep_invalid_regex_and_no_match(box, sources):
    assert "regex parse error" in err(call(box, "Grep", pattern="(unclosed"))
    assert ok(call(box, "Grep", pattern="zzz_nothing")) == "No matches for 'zzz_nothing'."


def test_grep_falls_back_to_grep_without_ripgrep(box, sources):
    sh(box, "mkdir -p /tmp/onlygrep && ln -sf \"$(command -v grep)\" /tmp/onlygrep/grep"
            " && for t in mktemp cat rm mv; do ln -sf \"$(command -v $t)\" /tmp/onlygrep/$t; done && export PATH=/tmp/onlygrep")
    assert sh(box, "command -v rg || echo no-rg") == "no-rg"
    out = ok(call(box, "Grep", pattern="launch_add"))
    assert out.splitlines() == ["Found 2 files:", "kernels/add.cu", "kernels/add_binding.cpp"]
    out = ok(call(box, "Grep", pattern="__global__", output_mode="content", type="cuda", **{"-B": 1}))
    assert out.splitlines() == ["kernels/add.cu-1-// header", "kernels/add.cu:2:__global__ void add_kernel() {}"]


# --------------------------------------------------------------------------- Bash


def test_bash_state_persists_between_calls(box, sandbox):
    sh(box, "cd kernels && export MY_VAR=42 && greet() { echo hello $1; } && alias ll='echo aliased'")
    assert sh(box, "pwd") == f"{sandbox.workdir}/kernels"
    assert sh(box, "echo $MY_VAR") == "42"
    assert sh(box, "greet agent") == "hello agent"
    assert sh(box, "ll") == "aliased"


def test_bash_reports_exit_code_and_no_output(box):
    result = call(box, "Bash", command="echo oops >&2; exit 3")
    assert not result.is_error  # the command ran; the exit code is information
    assert result.output == "oops\n[exit code 3]" and result.data["exit_code"] == 3
    assert ok(call(box, "Bash", command="true")) == "(no output)"


def test_bash_timeout_is_reported(box):
    result = call(box, "Bash", command="echo started; sleep 10", timeout=1000)
    assert "started" in result.output and "timed out after 1 s" in result.output and "run_in_background" in result.output
    assert result.data["timed_out"] is True
    assert sh(box, "echo alive") == "alive"


def test_background_job_output_and_kill(box):
    started = call(box, "Bash", command="for i in 1 2 3; do echo tick $i; sleep 0.2; done; sleep 60", run_in_background=True)
    job_id = started.data["bash_id"]
    assert job_id in ok(started)
    deadline = time.monotonic() + 10
    seen = ""
    while "tick 3" not in seen and time.monotonic() < deadline:
        seen += ok(call(box, "BashOutput", bash_id=job_id))
        time.sleep(0.1)
    assert "tick 1" in seen and "tick 3" in seen and "running" in seen
    assert "(no new output)" in ok(call(box, "BashOutput", bash_id=job_id))  # output is not repeated
    killed = call(box, "KillBash", shell_id=job_id)
    assert "Killed" in ok(killed) and killed.data["running"] is False
    assert "killed" in ok(call(box, "BashOutput", bash_id=job_id))
    assert "no background job" in err(call(box, "BashOutput", bash_id="bash_999"))


def test_bash_output_filter(box):
    job_id = call(box, "Bash", command="echo keep 1; echo drop 2; echo keep 3; touch kernels/done", run_in_background=True).data["bash_id"]
    sh(box, "for i in $(seq 100); do [ -e kernels/done ] && break; sleep 0.05; done")
    out = ok(call(box, "BashOutput", bash_id=job_id, filter="^keep"))
    assert "keep 1" in out and "keep 3" in out and "drop" not in out and "filter kept 2 lines" in out
    assert "not a valid regular expression" in err(call(box, "BashOutput", bash_id=job_id, filter="("))
    assert "exited with code 0" in _wait_until_finished(box, job_id)


def _wait_until_finished(box: ToolBox, job_id: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        result = call(box, "BashOutput", bash_id=job_id)
        if not result.data["running"]:
            return result.output
        time.sleep(0.05)
    raise AssertionError(f"background job {job_id} did not finish")


def test_huge_output_is_truncated_with_marker(box):
    result = call(box, "Bash", command="python3 -c \"print('H' * 100); print('x' * 200000); print('TAIL')\"")
    out = ok(result)
    assert len(out) <= DEFAULT_MAX_OUTPUT_CHARS
    assert out.startswith("H" * 100) and out.rstrip().endswith("TAIL")
    assert re.search(r"\[\.\.\. \d+ (characters|bytes of output) truncated \.\.\.\]", out)

    ok(call(box, "Write", file_path="kernels/big.txt", content="".join(f"{i:05d} " + "y" * 100 + "\n" for i in range(2000))))
    read = call(box, "Read", file_path="kernels/big.txt")
    assert len(read.output) <= DEFAULT_MAX_OUTPUT_CHARS + 100
    assert re.search(r"\[\.\.\. \d+ characters truncated \.\.\.\]", read.output)
    assert read.output.startswith("     1\t00000") and "  2000\t01999" in read.output and read.data["output_truncated"]


def test_output_cap_is_configurable(sandbox):
    box = ToolBox(sandbox, max_output_chars=2_000)
    out = ok(call(box, "Bash", command="seq 1 100000"))
    assert len(out) <= 2_000 and "truncated" in out and out.startswith("1\n2\n") and out.endswith("100000")


# --------------------------------------------------------------------------- TodoWrite


def test_todo_write_keeps_and_renders_the_list(box):
    out = ok(call(box, "TodoWrite", todos=[
        {"content": "Profile the reference", "status": "completed", "activeForm": "Profiling"},
        {"content": "Write the fused kernel", "status": "in_progress", "activeForm": "Writing the fused kernel"},
        {"content": "Tune the block size", "status": "pending"},
    ]))
    assert out.splitlines() == [
        "Todo list updated:",
        "[x] 1. Profile the reference",
        "[>] 2. Write the fused kernel  (Writing the fused kernel)",
        "[ ] 3. Tune the block size",
        "(1 completed, 1 in progress, 1 pending)",
    ]
    assert [t.content for t in box.todos] == ["Profile the reference", "Write the fused kernel", "Tune the block size"]


def test_todo_write_accepts_old_style_items(box):
    out = ok(call(box, "TodoWrite", todos=[{"id": "1", "content": "Profile", "status": "pending", "priority": "high"}]))
    assert "[ ] 1. Profile" in out


def test_todo_write_allows_at_most_one_in_progress(box):
    ok(call(box, "TodoWrite", todos=[{"content": "a", "status": "pending"}]))
    out = err(call(box, "TodoWrite", todos=[{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]))
    assert "at most one in_progress" in out
    assert [(t.content, t.status) for t in box.todos] == [("a", "pending")]


# --------------------------------------------------------------------------- NotebookEdit


def _notebook() -> str:
    return json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [
            {"id": "intro", "cell_type": "markdown", "metadata": {}, "source": ["# Bench\n"]},
            {"id": "code1", "cell_type": "code", "metadata": {}, "execution_count": 3, "source": ["x = 1\n"],
             "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}]},
        ],
    })


def test_notebook_edit_replaces_inserts_and_deletes_cells(box, ws):
    ok(call(box, "Write", file_path="kernels/bench.ipynb", content=_notebook()))
    shown = ok(call(box, "Read", file_path="kernels/bench.ipynb"))
    assert '<cell id="code1" index="1" type="code">' in shown and "x = 1" in shown and "<outputs>\n1\n</outputs>" in shown

    ok(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", cell_id="code1", new_source="x = 2\nprint(x)"))
    nb = json.loads((ws.path / "kernels/bench.ipynb").read_text())
    assert nb["cells"][1]["source"] == ["x = 2\n", "print(x)"] and nb["cells"][1]["outputs"] == []
    assert nb["cells"][1]["execution_count"] is None

    ok(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", cell_id="intro", new_source="y = 3", cell_type="code", edit_mode="insert"))
    nb = json.loads((ws.path / "kernels/bench.ipynb").read_text())
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code", "code"]
    assert nb["cells"][1]["source"] == ["y = 3"] and nb["cells"][1]["id"]

    ok(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", new_source="first", cell_type="markdown", edit_mode="insert"))
    ok(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", cell_id="intro", edit_mode="delete"))
    nb = json.loads((ws.path / "kernels/bench.ipynb").read_text())
    assert [("".join(c["source"]), c["cell_type"]) for c in nb["cells"]] == [("first", "markdown"), ("y = 3", "code"), ("x = 2\nprint(x)", "code")]


def test_notebook_edit_errors(box):
    ok(call(box, "Write", file_path="kernels/bench.ipynb", content=_notebook()))
    assert "no cell 'nope'" in err(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", cell_id="nope", new_source="x"))
    assert "cell_type" in err(call(box, "NotebookEdit", notebook_path="kernels/bench.ipynb", new_source="x", edit_mode="insert"))
    assert "not a notebook" in err(call(box, "NotebookEdit", notebook_path="model_new.py", cell_id="0", new_source="x"))
    ok(call(box, "Write", file_path="kernels/broken.ipynb", content="{not json"))
    assert "not a valid notebook" in err(call(box, "NotebookEdit", notebook_path="kernels/broken.ipynb", cell_id="0", new_source="x"))
