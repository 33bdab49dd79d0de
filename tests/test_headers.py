"""Precompiled torch headers (kernel_env.headers, utils/build.py): made by the host once per
toolchain, read-only in every sandbox, used by the sources that start with a torch header, and
never the cause of a rebuild of an unchanged workspace."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from kernel_env import headers
from kernel_env.resources import example_dir
from kernel_env.tasks import resolve_task
from kernel_env.workspace import Workspace
from test_build import compile_ws, last_line

pytestmark = pytest.mark.slow  # precompiles torch's headers (half a minute each)

SOLUTION = example_dir("relu_add") / "solutions" / "cpp"


@pytest.fixture(scope="module")
def precompiled() -> str:
    """The cpp header, precompiled into this session's KERNEL_ENV_HOME (~30 s on a small box)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
        proc = headers.precompile("cpp")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        again = headers.precompile("cpp")
    assert "(already there)" in again.stdout, again.stdout
    return re.search(r"PRECOMPILED: (\S+)", proc.stdout).group(1)


@pytest.fixture
def headers_on(monkeypatch, precompiled):
    monkeypatch.setenv("KERNEL_ENV_PRECOMPILED_HEADERS", "1")
    return precompiled


def _rules(ws: Workspace) -> dict[str, str]:
    text = (ws.path / "build" / "build.ninja").read_text()
    return {source: rule for rule, source in re.findall(r"^build \S+\.o: (\w+) (\S+)$", text, re.M)}


def _linked(ws: Workspace) -> list[str]:
    text = (ws.path / "build" / "build.ninja").read_text()
    return re.search(r"^build \S+: link (.*)$", text, re.M).group(1).split()


def test_the_host_precompiles_one_header_per_toolchain_readable_by_all(precompiled):
    header = Path(precompiled)
    assert header.parent.parent == headers.headers_dir()
    assert Path(f"{header}.gch").stat().st_size > 1 << 20
    assert oct(header.parent.stat().st_mode & 0o777) == "0o755"
    (binding,) = header.parent.glob("binding-*.o")  # binding.cpp's object, built with the header
    (settings,) = headers.headers_dir().glob("toolchain-*.json")  # torch's settings, found without importing it
    for made in (binding, settings):
        assert oct(made.stat().st_mode & 0o777) == "0o644"
    assert not list(headers.headers_dir().glob(".partial-*")) and not list(header.parent.glob(".partial-*"))


def test_a_sandbox_build_includes_them_in_the_torch_sources_only(headers_on, make_sandbox):
    sandbox = make_sandbox("cpp")
    sandbox.workspace.copy_solution(SOLUTION)
    result = sandbox.exec("bash utils/compile.sh", timeout=600)
    assert result.exit_code == 0, result.output
    assert "precompiled torch headers" in result.output and "BUILD OK" in result.output, result.output
    assert _rules(sandbox.workspace) == {"kernels/relu_add_binding.cpp": "cxx_pch",
                                         "kernels/relu_add.cpp": "cxx"}  # relu_add.cpp is plain C++
    # binding.cpp is the host's object, linked as it is: a fixed, protected file compiled once per toolchain.
    assert any(re.search(r"/binding-\w+\.o$", item) for item in _linked(sandbox.workspace)), _linked(sandbox.workspace)
    assert "CXX binding.cpp" not in result.output and "binding.cpp prebuilt" in result.output


def test_a_first_build_takes_the_torch_settings_from_the_host(headers_on, tmp_path):
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path)
    ws.copy_solution(SOLUTION)
    proc = compile_ws(ws, KE_HEADERS=str(headers.headers_dir()))
    assert proc.returncode == 0, proc.output
    settings = (ws.path / "build" / ".toolchain.json").read_text()
    assert settings in {p.read_text() for p in headers.headers_dir().glob("toolchain-*.json")}


def test_the_agent_cannot_change_them(headers_on, make_sandbox):
    sandbox = make_sandbox("cpp")
    key = Path(headers_on).parent.name
    edit = sandbox.exec(f'echo "#define relu(x) 0" >> "$KE_HEADERS/{key}/torch_headers.h"')
    plant = sandbox.exec('touch "$KE_HEADERS/planted"')
    for refused in (edit, plant):  # a read-only mount (and, in a container, files of another owner)
        assert refused.exit_code != 0 and re.search("Read-only file system|Permission denied", refused.output), refused.output
    assert Path(headers_on).read_text().count("#include") == 2 and not (headers.headers_dir() / "planted").exists()


def test_a_build_begun_without_them_goes_on_without(precompiled, tmp_path):
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path)
    ws.copy_solution(SOLUTION)
    first = compile_ws(ws)  # no KE_HEADERS: the first episodes on a machine build before the header exists
    assert first.returncode == 0 and "precompiled" not in first.output, first.output
    again = compile_ws(ws, KE_HEADERS=str(headers.headers_dir()))
    assert "0 rebuilt" in last_line(again), again.output  # its arrival recompiles nothing
    assert set(_rules(ws).values()) == {"cxx"} and "binding.cpp" in _rules(ws)  # nor does the host's binding object
    shutil.rmtree(ws.path / "build")  # a fresh build takes it
    fresh = compile_ws(ws, KE_HEADERS=str(headers.headers_dir()))
    assert fresh.returncode == 0 and "precompiled torch headers" in fresh.output, fresh.output
    assert _rules(ws)["kernels/relu_add_binding.cpp"] == "cxx_pch" and "binding.cpp" not in _rules(ws)


def test_a_header_that_disappears_is_no_longer_included(tmp_path):
    """A removed cache (or another toolchain's key) builds as if there were none."""
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path)
    ws.copy_solution(SOLUTION)
    empty = tmp_path / "no-headers"
    empty.mkdir()
    proc = compile_ws(ws, KE_HEADERS=str(empty))
    assert proc.returncode == 0 and "precompiled" not in proc.output, proc.output


@pytest.mark.parametrize(("source", "uses"), [
    ('#include <torch/extension.h>\nint x;\n', True),
    ('// a comment with #include <torch/types.h>\n#include "../binding_registry.h"\n', True),
    ('#pragma once\n#include <ATen/ATen.h>\n', True),
    ('#include <pybind11/pybind11.h>\n', True),
    ('#include <cstdint>\n#include <torch/types.h>\n', False),      # g++ would see torch before <cstdint>
    ('#define TORCH_ASSERT_ONLY_METHOD_OPERATORS\n#include <torch/types.h>\n', False),
    ('float relu(float v) { return v; }\n', False),
])
def test_only_sources_whose_first_directive_includes_torch_take_the_header(tmp_path, source, uses):
    import importlib.util

    from kernel_env.resources import data_dir

    spec = importlib.util.spec_from_file_location("ke_build", data_dir("workspace_template") / "utils" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    path = tmp_path / "k.cpp"
    path.write_text(source)
    assert build.starts_with_torch(path) is uses


def test_headers_are_only_for_languages_that_build_cpp():
    with pytest.raises(ValueError, match="triton"):
        headers.precompile("triton")
    assert os.environ.get("KERNEL_ENV_PRECOMPILED_HEADERS") == "0"  # the suite's default (conftest.py)


def test_kernel_env_headers_precompiles_on_request(precompiled):
    from typer.testing import CliRunner

    from kernel_env.cli import app

    done = CliRunner().invoke(app, ["headers", "cpp"])
    assert done.exit_code == 0 and f"cpp: PRECOMPILED: {precompiled} (already there)" in done.stdout, done.output
    wrong = CliRunner().invoke(app, ["headers", "triton"])
    assert wrong.exit_code == 2 and "no headers to precompile for 'triton'" in wrong.output


def test_without_an_argument_it_makes_only_the_headers_this_machine_can_use(precompiled, monkeypatch):
    """No GPU here: the cpp header, and a line saying the (500 MB) cuda one was skipped and how to make it."""
    from typer.testing import CliRunner

    from kernel_env.cli import app
    from kernel_env.runtime import episode

    monkeypatch.setattr(episode, "visible_gpus", lambda: [])
    done = CliRunner().invoke(app, ["headers"])
    assert done.exit_code == 0, done.output
    assert f"cpp: PRECOMPILED: {precompiled} (already there)" in done.stdout, done.output
    assert "cuda: skipped (no GPU here, so no cuda workspaces); `kernel-env headers cuda` makes it anyway" in done.stdout


def test_the_cuda_header_is_worth_making_only_with_a_gpu_and_nvcc(tmp_path, monkeypatch):
    assert headers.worth_making("cpu") == (["cpp"], {"cuda": "no GPU here, so no cuda workspaces"})
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert headers.worth_making("cuda") == (["cpp", "cuda"], {})
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(headers, "_nvcc", lambda: None)
    assert headers.worth_making("cuda")[1] == {"cuda": "no nvcc found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"}


def test_turned_off_a_sandbox_neither_mounts_nor_names_them(make_sandbox):
    sandbox = make_sandbox("cpp")  # the suite's default: KERNEL_ENV_PRECOMPILED_HEADERS=0
    result = sandbox.exec('echo "[${KE_HEADERS-unset}]"; test -e /run/kernel_env/headers && echo mounted; true')
    assert result.output.split() == ["[unset]"], result.output
