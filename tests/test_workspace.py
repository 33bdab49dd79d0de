"""Workspaces: the CUDA Agent layout per language, protected files, tamper detection, solutions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kernel_env.config import workspaces_dir
from kernel_env.resources import data_dir, example_dir
from kernel_env.workspace import PROTECTED, Checks, Workspace, state_checks

BINDING_FILES = {"binding.cpp", "binding_registry.h"}
COMMON = {"SKILL.md", "kernels", "utils", "model.py", "model_new.py"}
LANGUAGE_LAYOUT = [("cuda", COMMON | BINDING_FILES), ("cpp", COMMON | BINDING_FILES), ("triton", COMMON)]


def _files_under(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _writable_bits(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode) & 0o222


def _force_write(path: Path, text: str) -> None:
    """Write as the host's owner would after lifting the read-only bit (what a tamperer outside the sandbox does)."""
    path.chmod(0o644)
    path.write_text(text)


@pytest.mark.parametrize("language, expected", LANGUAGE_LAYOUT)
def test_the_workspace_has_exactly_the_cuda_agent_layout(make_workspace, language, expected):
    ws = make_workspace(language)
    assert {p.name for p in ws.path.iterdir()} == expected
    assert ws.path.name == "workspace" and ws.state_dir.is_dir()
    assert (ws.path / "kernels").is_dir()


@pytest.mark.parametrize("language", ["cuda", "cpp"])
def test_cpp_languages_get_the_binding_machinery_from_the_template(make_workspace, language):
    ws = make_workspace(language)
    template = data_dir("workspace_template")
    for name in BINDING_FILES:
        assert (ws.path / name).read_bytes() == (template / name).read_bytes()
    assert "REGISTER_BINDING" in (ws.path / "binding_registry.h").read_text()


def test_triton_workspaces_have_no_binding_files(make_workspace):
    ws = make_workspace("triton")
    assert not any((ws.path / name).exists() for name in BINDING_FILES)


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_workspace_holds_the_task_the_skill_and_the_starter(make_workspace, tiny_task, language):
    ws = make_workspace(language, tiny_task)
    assert (ws.path / "model.py").read_text() == tiny_task.code
    skills = data_dir("skills") / language
    assert (ws.path / "SKILL.md").read_text() == state_checks((skills / "SKILL.md").read_text(), None)
    assert (ws.path / "model_new.py").read_bytes() == (skills / "model_new.py").read_bytes()
    template = _files_under(data_dir("workspace_template") / "utils")
    template["verification.py"] = state_checks(template["verification.py"].decode(), None).encode()
    assert _files_under(ws.path / "utils") == template
    assert {"compile.sh"} <= set(_files_under(ws.path / "utils"))
    assert ws.task is tiny_task and ws.language.name == language


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_protected_files_are_read_only_and_agent_files_writable(make_workspace, language):
    ws = make_workspace(language)
    protected = [p for name in PROTECTED if (ws.path / name).exists() for p in [ws.path / name, *(ws.path / name).rglob("*")]]
    assert protected, "no protected files"
    not_read_only = [str(p.relative_to(ws.path)) for p in protected if _writable_bits(p)]
    assert not_read_only == []
    assert _writable_bits(ws.path / "model_new.py") and _writable_bits(ws.path / "kernels")


def test_every_protected_file_is_hashed_at_creation(make_workspace):
    ws = make_workspace("cuda")
    expected = {name for name in PROTECTED if (ws.path / name).is_file()}
    expected |= {f"utils/{rel}" for rel in _files_under(ws.path / "utils")}
    assert set(ws.protected_hashes) == expected
    assert all(len(h) == 64 for h in ws.protected_hashes.values())


def test_a_fresh_workspace_is_not_tampered(make_workspace):
    assert make_workspace("cuda").tampered_files() == []


def test_changing_model_py_is_detected(make_workspace):
    ws = make_workspace("cpp")
    _force_write(ws.path / "model.py", ws.task.code.replace("relu", "sigmoid"))
    assert ws.tampered_files() == ["model.py"]


def test_adding_changing_or_removing_files_under_utils_is_detected(make_workspace):
    ws = make_workspace("cpp")
    utils = ws.path / "utils"
    utils.chmod(0o755)
    (utils / "sitecustomize.py").write_text("print('hijacked')\n")
    _force_write(utils / "compile.sh", "exit 0\n")
    some_other = sorted(set(_files_under(utils)) - {"compile.sh", "sitecustomize.py"})
    if some_other:
        (utils / some_other[0]).unlink()
    expected = sorted({"utils/sitecustomize.py", "utils/compile.sh", *(f"utils/{n}" for n in some_other[:1])})
    assert ws.tampered_files() == expected


def test_changing_the_binding_files_or_the_skill_is_detected(make_workspace):
    ws = make_workspace("cuda")
    for name in ("binding.cpp", "binding_registry.h", "SKILL.md"):
        _force_write(ws.path / name, "// replaced\n")
    assert ws.tampered_files() == ["SKILL.md", "binding.cpp", "binding_registry.h"]


def test_agent_files_may_change_freely(make_workspace):
    ws = make_workspace("cpp")
    (ws.path / "model_new.py").write_text("class ModelNew: pass\n")
    (ws.path / "kernels" / "relu.cpp").write_text("// kernel\n")
    (ws.path / "build").mkdir()
    assert ws.tampered_files() == []


def test_copy_solution_copies_only_the_agent_files(make_workspace, tmp_path):
    ws = make_workspace("cpp")
    (ws.path / "kernels" / "stale_old.cpp").write_text("// from an earlier attempt\n")
    solution = tmp_path / "solution"
    (solution / "kernels" / "__pycache__").mkdir(parents=True)
    (solution / "kernels" / "build").mkdir()
    (solution / "model_new.py").write_text("class ModelNew: pass\n")
    (solution / "kernels" / "relu.cpp").write_text("// relu\n")
    (solution / "kernels" / "relu_binding.cpp").write_text("// binding\n")
    (solution / "kernels" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (solution / "kernels" / "build" / "relu.o").write_bytes(b"\0")
    # A solution cannot smuggle in protected files.
    (solution / "model.py").write_text("class Model: pass\n")
    (solution / "utils").mkdir()
    (solution / "utils" / "compile.sh").write_text("exit 0\n")

    copied = ws.copy_solution(solution)

    assert sorted(copied) == ["kernels/relu.cpp", "kernels/relu_binding.cpp", "model_new.py"]
    assert sorted(p.name for p in (ws.path / "kernels").iterdir()) == ["relu.cpp", "relu_binding.cpp"]
    assert (ws.path / "model_new.py").read_text() == "class ModelNew: pass\n"
    assert ws.tampered_files() == []


def test_copy_solution_needs_a_model_new_py(make_workspace, tmp_path):
    ws = make_workspace("cpp")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"solution .*empty: no model_new.py"):
        ws.copy_solution(tmp_path / "empty")


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_bundled_example_solutions_fit_their_workspaces(make_workspace, language):
    solution = example_dir("relu_add") / "solutions" / language
    if not solution.is_dir():
        pytest.fail(f"the bundled example has no {language} solution at {solution}")
    ws = make_workspace(language)
    copied = ws.copy_solution(solution)
    assert "model_new.py" in copied
    assert ws.tampered_files() == []


def test_workspaces_default_to_kernel_env_home_and_are_fresh_each_time(tiny_task):
    first = Workspace.create(tiny_task, "triton")
    second = Workspace.create(tiny_task, "triton")
    try:
        assert first.root.parent == second.root.parent == workspaces_dir()
        assert str(workspaces_dir()).startswith(os.environ["KERNEL_ENV_HOME"])
        assert first.root != second.root
        assert first.root.name.startswith("test_tiny_relu-triton-")
    finally:
        first.destroy()
        second.destroy()


def test_destroy_removes_everything_including_read_only_files(make_workspace):
    ws = make_workspace("cuda")
    ws.destroy()
    assert not ws.root.exists()
    ws.destroy()  # idempotent


def test_an_unknown_language_is_refused_with_the_choices(tiny_task, tmp_path):
    with pytest.raises(ValueError, match="unknown language 'fortran'; choose one of cuda, cpp, triton"):
        Workspace.create(tiny_task, "fortran", root=tmp_path)


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_skill_and_the_verification_script_state_the_checks_the_workspace_gets(tmp_path, tiny_task, language):
    ws = Workspace.create(tiny_task, language, root=tmp_path, checks=Checks(7, 1e-3, 2e-3, margin=0.1))
    for text in ((ws.path / "SKILL.md").read_text(), (ws.path / "utils" / "verification.py").read_text()):
        assert not any(mark in text for mark in ("{trials}", "{all_trials}", "{tolerance}", "{margin}", "{target}"))
        assert "atol = 0.001, rtol = 0.002" in text
    skill = (ws.path / "SKILL.md").read_text()
    assert "all 7 trials" in skill and "on 7 random input sets" in skill
    assert "at least 10% faster" in skill and "0.9 × the torch.compile time" in skill and "5%" not in skill
    assert not ws.tampered_files()
