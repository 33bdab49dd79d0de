"""The workspace build: utils/compile.sh + utils/build.py, binding.cpp / binding_registry.h,
and the relu_add example solutions, on the CPU.

One cold build of the cpp solution (the torch headers make it ~20-60 s on a small box) is
shared by the tests through a module-scoped fixture; each test that edits the workspace puts
it back before it ends. The CUDA solution is only compiled (nvcc needs no GPU), not run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernel_env.resources import data_dir, example_dir
from kernel_env.tasks import resolve_task
from kernel_env.workspace import Workspace

pytestmark = pytest.mark.slow  # one cold C++ build of the example, shared by the module

SOLUTIONS = example_dir("relu_add") / "solutions"
ARTIFACT_GLOB = "cuda_extension*.so"


def compile_env(**extra: str) -> dict[str, str]:
    """The environment a sandbox gives compile.sh: our python3 first on PATH, no HOME."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TORCH_CUDA_ARCH_LIST")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env.update(extra)
    return env


def compile_ws(ws: Workspace, *args: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", "utils/compile.sh", *args], cwd=ws.path, env=compile_env(**env),
        capture_output=True, text=True, timeout=600,
    )
    proc.output = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.output.strip().splitlines()
    return lines[-1] if lines else ""


def touch_later(path: Path, text: str) -> None:
    """Write `text` and move the mtime forward, so ninja sees a change even within one second."""
    path.write_text(text)
    later = time.time() + 2
    os.utime(path, (later, later))


def artifacts(ws: Workspace) -> list[Path]:
    return sorted((ws.path / "build").glob(ARTIFACT_GLOB))


@pytest.fixture(scope="module")
def cpp_build(tmp_path_factory):
    """A cpp workspace holding the relu_add solution, built once (cold) for the whole module."""
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path_factory.mktemp("cpp"))
    ws.copy_solution(SOLUTIONS / "cpp")
    started = time.monotonic()
    proc = compile_ws(ws)
    cold_seconds = time.monotonic() - started
    yield ws, proc, cold_seconds
    ws.destroy()


@pytest.fixture
def cpp_ws(cpp_build):
    """The built cpp workspace; kernels/ and model_new.py are restored after the test."""
    ws = cpp_build[0]
    saved = {p: p.read_text() for p in (ws.path / "kernels").iterdir()}
    yield ws
    for extra in set((ws.path / "kernels").iterdir()) - set(saved):
        extra.unlink()
    for path, text in saved.items():
        if path.read_text() != text:
            touch_later(path, text)
    assert compile_ws(ws).returncode == 0


# --------------------------------------------------------------------------- cpp: build and run


def test_cold_build_of_cpp_solution_succeeds_with_one_object_per_source(cpp_build):
    ws, proc, seconds = cpp_build
    assert proc.returncode == 0, proc.output
    assert last_line(proc).startswith("BUILD OK: build/cuda_extension"), proc.output
    assert "(3 objects, 3 rebuilt" in last_line(proc)
    for source in ("binding.cpp", "kernels/relu_add.cpp", "kernels/relu_add_binding.cpp"):
        assert f"CXX {source}" in proc.output
    assert len(artifacts(ws)) == 1
    print(f"cold build: {seconds:.1f}s")


def test_build_writes_nothing_into_protected_utils(cpp_build):
    ws = cpp_build[0]
    assert not list((ws.path / "utils").rglob("__pycache__"))
    assert not list(ws.path.rglob("*.pyc"))
    assert ws.tampered_files() == []


def test_built_module_imports_and_matches_torch(cpp_build):
    ws = cpp_build[0]
    script = textwrap.dedent("""
        import sys
        sys.path[:0] = ["build", "."]
        import torch, cuda_extension
        from model import Model, get_inputs
        from model_new import ModelNew
        assert list(cuda_extension.__bindings__) == ["relu_add"]
        x, y = get_inputs()
        torch.testing.assert_close(cuda_extension.relu_add(x, y), torch.relu(x + y), rtol=0, atol=0)
        torch.testing.assert_close(ModelNew()(x, y), Model()(x, y), rtol=0, atol=0)
        odd = torch.tensor([float("nan"), -1.0, 0.5]), torch.tensor([0.0, 0.25, 0.25])
        torch.testing.assert_close(cuda_extension.relu_add(*odd), torch.relu(odd[0] + odd[1]), equal_nan=True)
        small = torch.randn(1001), torch.randn(1001)   # below the OpenMP threshold, odd length
        torch.testing.assert_close(cuda_extension.relu_add(*small), torch.relu(small[0] + small[1]))
        print("MATCH")
    """)
    proc = subprocess.run([sys.executable, "-B", "-c", script], cwd=ws.path, env=compile_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "MATCH" in proc.stdout, proc.stdout + proc.stderr


def test_unchanged_workspace_rebuilds_nothing(cpp_ws):
    proc = compile_ws(cpp_ws)
    assert proc.returncode == 0, proc.output
    assert "(3 objects, 0 rebuilt" in last_line(proc)


def test_editing_one_kernel_recompiles_only_that_object_and_relinks(cpp_ws):
    kernel = cpp_ws.path / "kernels" / "relu_add.cpp"
    touch_later(kernel, kernel.read_text() + "\n// an edit\n")
    proc = compile_ws(cpp_ws)
    assert proc.returncode == 0, proc.output
    assert "CXX kernels/relu_add.cpp" in proc.output
    assert "CXX binding.cpp" not in proc.output and "relu_add_binding.cpp" not in proc.output
    assert "LINK build/cuda_extension" in proc.output
    assert "(3 objects, 1 rebuilt" in last_line(proc)


def test_a_kernel_edit_that_needs_no_new_symbol_relinks_without_the_load_check(cpp_ws):
    loaded = cpp_ws.path / "build" / ".loaded.json"  # written by the last load check that passed
    before = loaded.stat().st_mtime_ns
    kernel = cpp_ws.path / "kernels" / "relu_add.cpp"
    touch_later(kernel, kernel.read_text().replace("const float v", "const float  v"))
    proc = compile_ws(cpp_ws)
    assert proc.returncode == 0 and "LINK build/cuda_extension" in proc.output, proc.output
    assert loaded.stat().st_mtime_ns == before  # the module needs what the last one that loaded did


def test_editing_a_kernel_header_recompiles_the_sources_that_include_it(cpp_ws):
    kernels = cpp_ws.path / "kernels"
    (kernels / "relu_add_config.h").write_text("#pragma once\nconstexpr int kUnused = 1;\n")
    kernel = kernels / "relu_add.cpp"
    touch_later(kernel, '#include "relu_add_config.h"\n' + kernel.read_text())
    assert compile_ws(cpp_ws).returncode == 0
    touch_later(kernels / "relu_add_config.h", "#pragma once\nconstexpr int kUnused = 2;\n")
    proc = compile_ws(cpp_ws)
    assert proc.returncode == 0, proc.output
    assert "CXX kernels/relu_add.cpp" in proc.output and "(3 objects, 1 rebuilt" in last_line(proc)


# --------------------------------------------------------------------------- cpp: failures


def test_compile_error_shows_file_and_line_and_removes_the_stale_module(cpp_ws):
    kernel = cpp_ws.path / "kernels" / "relu_add.cpp"
    lines = kernel.read_text().splitlines()
    bad_line = next(i for i, line in enumerate(lines) if "const float v" in line) + 1
    lines[bad_line - 1] = "    const float v = x[i] + undeclared_thing;"
    touch_later(kernel, "\n".join(lines) + "\n")
    proc = compile_ws(cpp_ws)
    assert proc.returncode != 0
    assert f"kernels/relu_add.cpp:{bad_line}:" in proc.output, proc.output
    assert "undeclared_thing" in proc.output and "error" in proc.output
    assert last_line(proc).startswith("BUILD FAILED: kernels/relu_add.cpp failed"), proc.output
    assert "removed the stale build/cuda_extension" in last_line(proc)
    assert artifacts(cpp_ws) == [], "a failed build must not leave the previous module looking fresh"
    assert "-isystem" not in proc.output, "the (long) compiler command line should not be echoed"
    assert len(proc.output.splitlines()) < 40


def test_fixing_the_error_rebuilds_just_that_object(cpp_ws):
    kernel = cpp_ws.path / "kernels" / "relu_add.cpp"
    good = kernel.read_text()
    touch_later(kernel, good.replace("const float v", "const float v = ;\n    const float w"))
    assert compile_ws(cpp_ws).returncode != 0 and artifacts(cpp_ws) == []
    touch_later(kernel, good)
    proc = compile_ws(cpp_ws)
    assert proc.returncode == 0, proc.output
    assert "(3 objects, 1 rebuilt" in last_line(proc) and len(artifacts(cpp_ws)) == 1


def test_undefined_symbol_fails_the_build_instead_of_the_import(cpp_ws):
    kernel = cpp_ws.path / "kernels" / "relu_add.cpp"
    touch_later(kernel, kernel.read_text().replace("void relu_add_cpu(", "void relu_add_cpu_renamed("))
    proc = compile_ws(cpp_ws)
    assert proc.returncode != 0
    assert "undefined symbol" in proc.output and "relu_add_cpu" in proc.output, proc.output
    assert last_line(proc).startswith("BUILD FAILED: the module does not load")
    assert artifacts(cpp_ws) == []


def test_model_new_syntax_error_fails_the_build(cpp_ws):
    model_new = cpp_ws.path / "model_new.py"
    good = model_new.read_text()
    try:
        model_new.write_text(good + "\ndef broken(:\n")
        proc = compile_ws(cpp_ws)
        assert proc.returncode != 0
        assert "model_new.py:" in proc.output and last_line(proc).startswith("BUILD FAILED"), proc.output
        verdicts = [line for line in proc.output.splitlines() if line.startswith(("BUILD ", "CHECK ", "COMPILE "))]
        assert verdicts == [last_line(proc)], proc.output  # one verdict: never BUILD OK, then BUILD FAILED
        proc = compile_ws(cpp_ws, "kernels/relu_add.cpp")  # compiling one source says so too
        assert proc.returncode != 0 and last_line(proc).startswith("BUILD FAILED: model_new.py"), proc.output
        assert "COMPILE OK" not in proc.output, proc.output
    finally:
        model_new.write_text(good)


def test_duplicate_binding_names_are_rejected(cpp_ws):
    (cpp_ws.path / "kernels" / "other_binding.cpp").write_text(
        '#include "../binding_registry.h"\nstatic void reg(pybind11::module& m) {}\nREGISTER_BINDING(relu_add, reg);\n'
    )
    proc = compile_ws(cpp_ws)
    assert proc.returncode != 0
    assert "REGISTER_BINDING(relu_add" in proc.output and "other_binding.cpp" in proc.output, proc.output


def test_workspace_without_kernels_fails_clearly(tmp_path):
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=tmp_path)
    try:
        proc = compile_ws(ws)
        assert proc.returncode != 0
        assert last_line(proc).startswith("BUILD FAILED: no kernels to build"), proc.output
        (ws.path / "kernels" / "oops.cu").write_text("__global__ void k() {}\n")
        proc = compile_ws(ws)
        assert proc.returncode != 0 and "CPU C++ workspace" in last_line(proc), proc.output
    finally:
        ws.destroy()


# --------------------------------------------------------------------------- cuda


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


@pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed on this machine (CUDA_HOME, PATH, /usr/local/cuda)")
def test_cuda_solution_kernel_compiles_with_nvcc(tmp_path):
    ws = Workspace.create(resolve_task("example/relu_add"), "cuda", root=tmp_path)
    try:
        ws.copy_solution(SOLUTIONS / "cuda")
        proc = compile_ws(ws, "kernels/relu_add.cu", TORCH_CUDA_ARCH_LIST="9.0")
        assert proc.returncode == 0, proc.output
        assert "NVCC kernels/relu_add.cu" in proc.output
        assert last_line(proc).startswith("COMPILE OK: kernels/relu_add.cu"), proc.output
        assert (ws.path / "build" / "obj" / "kernels" / "relu_add.cu.o").is_file()
        ninja = (ws.path / "build" / "build.ninja").read_text()
        assert "-gencode=arch=compute_90,code=sm_90" in ninja
        assert "-lcudart" in ninja and "-ltorch_cuda" in ninja
        assert artifacts(ws) == []  # compile-only: nothing linked
    finally:
        ws.destroy()


# --------------------------------------------------------------------------- triton


def test_triton_check_accepts_the_solution_and_catches_a_syntax_error(tmp_path):
    ws = Workspace.create(resolve_task("example/relu_add"), "triton", root=tmp_path)
    try:
        assert not (ws.path / "binding.cpp").exists()
        ws.copy_solution(SOLUTIONS / "triton")
        proc = compile_ws(ws)
        assert proc.returncode == 0, proc.output
        assert "first launch" in proc.output and last_line(proc).startswith("CHECK OK"), proc.output
        (ws.path / "kernels" / "helpers.py").write_text("def f(:\n    pass\n")
        proc = compile_ws(ws)
        assert proc.returncode != 0
        assert "kernels/helpers.py:1" in proc.output and last_line(proc).startswith("BUILD FAILED"), proc.output
        assert " OK" not in proc.output, proc.output
        (ws.path / "kernels" / "helpers.py").unlink()
        (ws.path / "model_new.py").write_text((ws.path / "model_new.py").read_text() + "\ndef broken(:\n")
        proc = compile_ws(ws)
        assert proc.returncode != 0 and "model_new.py:" in proc.output, proc.output
        assert last_line(proc).startswith("BUILD FAILED") and " OK" not in proc.output, proc.output
        assert not list(ws.path.rglob("__pycache__")) and not list(ws.path.rglob("*.pyc"))
    finally:
        ws.destroy()


# --------------------------------------------------------------------------- pieces


def _build_module():
    spec = importlib.util.spec_from_file_location("kernel_env_ws_build", data_dir("workspace_template") / "utils" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spec, expected", [
    ("9.0", ["-gencode=arch=compute_90,code=sm_90"]),
    ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a"]),
    ("8.0;9.0+PTX", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
                     "-gencode=arch=compute_90,code=compute_90"]),
    ("8.6 9.0", ["-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_90,code=sm_90"]),
    ("Hopper", ["-gencode=arch=compute_90,code=sm_90"]),
    (None, ["-gencode=arch=compute_90,code=sm_90"]),
])
def test_cuda_arch_list_becomes_gencode_flags(monkeypatch, spec, expected):
    monkeypatch.delenv("KERNEL_ENV_CUDA_ARCH", raising=False)
    if spec is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", spec)
    assert _build_module().cuda_arch_flags() == expected


def test_unreadable_cuda_arch_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "nine")
    build = _build_module()
    with pytest.raises(build.BuildError, match="cannot read CUDA arch 'nine'"):
        build.cuda_arch_flags()


def test_starters_are_importable_and_honest():
    for language in ("cuda", "cpp", "triton"):
        starter = data_dir("skills") / language / "model_new.py"
        text = starter.read_text()
        assert "class ModelNew" in text
        for banned in ("NotImplementedError", "TODO", "FIXME"):
            assert banned not in text, f"{starter} contains {banned}"
        compile(text, str(starter), "exec")
        skill = (data_dir("skills") / language / "SKILL.md").read_text()
        assert skill.startswith(f"---\nname: {language}\ndescription: ")
