"""The source rules (evaluators/static_rules.py) on kernels/ sources, read as text before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel_env.evaluators.static_rules import check_sources
from kernel_env.resources import example_dir

BINDING = """\
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"

static torch::Tensor relu_add_forward(const torch::Tensor& x, const torch::Tensor& y) {{
  torch::Tensor out = torch::empty_like(x);
  {body}
  return out;
}}

static void register_relu_add(pybind11::module& m) {{
  m.def("relu_add", &relu_add_forward, "relu(x + y)", pybind11::arg("x"), pybind11::arg("y"));
}}

REGISTER_BINDING(relu_add, register_relu_add);
"""


def _snapshot(tmp_path: Path, body: str) -> Path:
    snapshot = tmp_path / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text("import torch.nn as nn\n")
    (snapshot / "kernels" / "relu_add_binding.cpp").write_text(BINDING.format(body=body))
    return snapshot


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_bundled_solutions_break_no_rule(language):
    assert check_sources(example_dir("relu_add") / "solutions" / language) == []


def test_a_binding_that_only_defines_functions_breaks_no_rule(tmp_path):
    assert check_sources(_snapshot(tmp_path, "// the launch goes here")) == []


@pytest.mark.parametrize("body", [
    'auto frame = pybind11::module_::import("sys").attr("_getframe")(2);',
    'auto sys = py::module::import("sys");',
    'py::exec("import sys");',
    'auto g = pybind11::globals();',
    'PyObject* frame = (PyObject*) PyEval_GetFrame();',
    'PyObject* sys = PyImport_ImportModule("sys");',
    'PyRun_SimpleString("import gc");',
    'auto o = pybind11::reinterpret_borrow<pybind11::object>(handle);',
], ids=["pybind-import-attr", "py-module-import", "py-exec", "globals", "PyEval_GetFrame", "PyImport", "PyRun", "reinterpret"])
def test_reaching_into_the_python_interpreter_from_a_binding_is_refused(tmp_path, body):
    violations = check_sources(_snapshot(tmp_path, body))
    assert any("reaches into the Python interpreter" in v and "relu_add_binding.cpp:7" in v for v in violations), violations


@pytest.mark.parametrize("body", [
    'FILE* mem = fopen("/proc/self/mem", "r+");',
    'std::ifstream maps("/proc/self/maps");',
    'mprotect(page, 4096, 7);',
    'syscall(56, 0, 0);',
    'int fd = open("/job/ref/ref_trial_0.pt", 0);',
], ids=["fopen", "ifstream", "mprotect", "syscall", "open"])
def test_touching_files_or_the_process_from_native_code_is_refused(tmp_path, body):
    violations = check_sources(_snapshot(tmp_path, body))
    assert any("touches files, file descriptors, memory mappings or the process" in v for v in violations), violations


def test_a_tensor_clone_in_a_binding_is_not_mistaken_for_the_clone_system_call(tmp_path):
    assert check_sources(_snapshot(tmp_path / "a", "torch::Tensor copy = out.clone();")) == []
    assert check_sources(_snapshot(tmp_path / "b", "clone(child, stack, 0, nullptr);"))


def test_names_in_comments_and_strings_are_not_code(tmp_path):
    snapshot = _snapshot(tmp_path, '// never PyEval_GetFrame() or fopen() here\n  TORCH_CHECK(true, "no py::exec");')
    assert check_sources(snapshot) == []


def test_the_rule_names_file_and_line(tmp_path):
    snapshot = _snapshot(tmp_path, "")
    shutil.copy2(snapshot / "kernels" / "relu_add_binding.cpp", snapshot / "kernels" / "other_binding.cpp")
    (snapshot / "kernels" / "other_binding.cpp").write_text("\n\nvoid f() { PyEval_GetFrame(); }\n")
    assert check_sources(snapshot) == [
        "kernels/other_binding.cpp:3 reaches into the Python interpreter (a binding only defines functions: "
        "`m.def(...)` with `pybind11::arg`): `PyEval_GetFrame(`"]


@pytest.mark.parametrize("body", [
    "write(5, reply, n);",
    "::send(7, mark, 6, 0);",
    "ssize_t got = read(0, line, sizeof line);",
    'FILE* reply = fdopen(5, "w");',
    "dup2(5, 1);",
], ids=["write", "send", "read", "fdopen", "dup2"])
def test_reading_or_writing_file_descriptors_from_native_code_is_refused(tmp_path, body):
    """The harness's pipes and its marks socket are open in the candidate's process: a forged answer
    or timing mark must not be one system call away."""
    violations = check_sources(_snapshot(tmp_path, body))
    assert any("file descriptors" in v for v in violations), violations


def test_system_calls_in_inline_assembly_are_refused_even_inside_the_asm_string(tmp_path):
    violations = check_sources(_snapshot(tmp_path, 'asm volatile("mov $1, %%rax; syscall" ::: "rax");'))
    assert any("makes system calls from inline assembly" in v for v in violations), violations


def test_inline_ptx_and_a_comment_about_syscalls_are_fine(tmp_path):
    snapshot = _snapshot(tmp_path, '// no syscall is made here\n  asm volatile("membar.gl;");')
    assert check_sources(snapshot) == []


def _python(tmp_path: Path, code: str) -> list[str]:
    snapshot = tmp_path / "python"
    snapshot.mkdir()
    (snapshot / "model_new.py").write_text("import torch\nimport torch.nn as nn\n\n" + code + "\n")
    return check_sources(snapshot)


@pytest.mark.parametrize("code", [
    "import __main__",
    "import timing",
    "from guards import Integrity",
    "import io",
    "from posix import write",
    "line = input()",
    "os.write(7, b'end:0')",
    "os.fdopen(7, 'w')",
    "frame = error.__traceback__.tb_frame.f_back",
    "Path('/proc/self/fd/7').write_text('{}')",
], ids=["__main__", "timing", "guards", "io", "posix", "input", "os.write", "os.fdopen", "traceback-frames", "write_text"])
def test_python_ways_to_the_harness_channel_and_frames_are_refused(tmp_path, code):
    assert _python(tmp_path, code), code


def test_os_path_and_reading_a_file_are_still_fine(tmp_path):
    assert _python(tmp_path, "HERE = os.path.dirname(__file__)\nSOURCE = Path(HERE, 'kernels', 'k.py').read_text()") == []


@pytest.mark.parametrize("code", [
    "start = time.perf_counter()",
    "from time import perf_counter_ns",
    "ms = begin.elapsed_time(end)",
    "event = torch.cuda.Event(enable_timing=True)",
    "from triton.testing import do_bench",
], ids=["perf_counter", "from-time-import", "elapsed_time", "enable_timing", "do_bench"])
def test_clocks_in_python_are_refused(tmp_path, code):
    assert any("reads a clock" in v for v in _python(tmp_path, "import time\n" + code)), code


def test_sleeping_is_not_reading_a_clock(tmp_path):
    assert _python(tmp_path, "import time\ntime.sleep(0)") == []


@pytest.mark.parametrize("body", [
    "auto t0 = std::chrono::steady_clock::now();",
    "unsigned long long t = __rdtsc();",
    "cudaEventElapsedTime(&ms, a, b);",
    "timespec ts; clock_gettime(1, &ts);",
], ids=["chrono", "rdtsc", "event-elapsed", "clock_gettime"])
def test_clocks_in_native_code_are_refused(tmp_path, body):
    assert any("reads a clock" in v for v in check_sources(_snapshot(tmp_path, body))), body


@pytest.mark.parametrize("body", [
    "cudaMemcpyAsync(host, x.data_ptr<float>(), bytes, cudaMemcpyDeviceToHost, stream);",
    "cudaMemcpy(host, device, bytes, cudaMemcpyDefault);",
    "cudaHostAlloc(&host, bytes, 0);",
    "cudaMallocManaged(&shared, bytes);",
    "torch::Tensor on_host = x.cpu();",
], ids=["d2h", "default", "host-alloc", "managed", "cpu"])
def test_moving_data_to_the_host_in_native_code_is_refused(tmp_path, body):
    assert any("from the GPU to the host" in v for v in check_sources(_snapshot(tmp_path, body))), body


def test_copying_a_table_to_the_device_is_fine(tmp_path):
    body = "cudaMemcpyAsync(device_table, host_table, bytes, cudaMemcpyHostToDevice, stream);"
    assert check_sources(_snapshot(tmp_path, body)) == []
