"""The source rules (evaluators/static_rules.py): model_new.py and kernels/ read as text before anything runs."""

from __future__ import annotations

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

INTERPRETER = "reaches into the Python interpreter"
PROCESS = "touches files, file descriptors, memory mappings or the process"
NATIVE_CLOCK = "reads a clock"
TO_HOST = "from the GPU to the host"
ASM_SYSCALL = "makes system calls from inline assembly"
THREADS = "starts threads or processes"
UNQUALIFIED = "names torch's functions without their namespace"

# C++ in a binding, each refused with the rule's message.
NATIVE_REFUSED = {
    # From C++ the interpreter's frames and the harness's objects are as open as from Python.
    "pybind-import-attr": ('auto frame = pybind11::module_::import("sys").attr("_getframe")(2);', INTERPRETER),
    "py-module-import": ('auto sys = py::module::import("sys");', INTERPRETER),
    "py-exec": ('py::exec("import sys");', INTERPRETER),
    "globals": ("auto g = pybind11::globals();", INTERPRETER),
    "PyEval_GetFrame": ("PyObject* frame = (PyObject*) PyEval_GetFrame();", INTERPRETER),
    "PyImport": ('PyObject* sys = PyImport_ImportModule("sys");', INTERPRETER),
    "PyRun": ('PyRun_SimpleString("import gc");', INTERPRETER),
    "reinterpret": ("auto o = pybind11::reinterpret_borrow<pybind11::object>(handle);", INTERPRETER),
    # The harness's pipes and its parent socket are open in the candidate's process.
    "fopen": ('FILE* mem = fopen("/proc/self/mem", "r+");', PROCESS),
    "ifstream": ('std::ifstream maps("/proc/self/maps");', PROCESS),
    "mprotect": ("mprotect(page, 4096, 7);", PROCESS),
    "syscall": ("syscall(56, 0, 0);", PROCESS),
    "open": ('int fd = open("/job/ref/ref_trial_0.pt", 0);', PROCESS),
    "write": ("write(5, reply, n);", PROCESS),
    "send": ("::send(7, mark, 6, 0);", PROCESS),
    "read": ("ssize_t got = read(0, line, sizeof line);", PROCESS),
    "fdopen": ('FILE* reply = fdopen(5, "w");', PROCESS),
    "dup2": ("dup2(5, 1);", PROCESS),
    "symlink": ('symlink("/dev/zero", "/job/cand/cand_trial_0.pt");', PROCESS),
    "clone": ("clone(child, stack, 0, nullptr);", PROCESS),
    # A process of its own (own CUDA context, fed through CUDA IPC) is past the timing's synchronise.
    "posix_spawn": ('posix_spawn(&pid, "/usr/bin/python3", nullptr, nullptr, argv, envp);', "starts threads or processes"),
    "cuda-ipc": ("cudaIpcGetMemHandle(&handle, x.data_ptr<float>());", "shares device memory with other processes"),
    "cu-mem-export": ("cuMemExportToShareableHandle(&fd, alloc, type, 0);", "shares device memory with other processes"),
    # ... and so is a view of /proc made by a namespace of its own.
    "unshare": ("unshare(0x00020000 | 0x10000000);", PROCESS),
    "mount": ('mount("none", "/proc", "tmpfs", 0, nullptr);', PROCESS),
    "asm-syscall": ('asm volatile("mov $1, %%rax; syscall" ::: "rax");', ASM_SYSCALL),
    # A clock tells audited calls (slower under the audit) from timed ones.
    "chrono": ("auto t0 = std::chrono::steady_clock::now();", NATIVE_CLOCK),
    "rdtsc": ("unsigned long long t = __rdtsc();", NATIVE_CLOCK),
    "event-elapsed": ("cudaEventElapsedTime(&ms, a, b);", NATIVE_CLOCK),
    "clock_gettime": ("timespec ts; clock_gettime(1, &ts);", NATIVE_CLOCK),
    # A host-side computation fed by the copy engines could run beside the device's work.
    "d2h": ("cudaMemcpyAsync(host, x.data_ptr<float>(), bytes, cudaMemcpyDeviceToHost, stream);", TO_HOST),
    "memcpy-default": ("cudaMemcpy(host, device, bytes, cudaMemcpyDefault);", TO_HOST),
    "host-alloc": ("cudaHostAlloc(&host, bytes, 0);", TO_HOST),
    "managed": ("cudaMallocManaged(&shared, bytes);", TO_HOST),
    "cpu": ("torch::Tensor on_host = x.cpu();", TO_HOST),
    # The evaluator's device record of audited calls is CUPTI's.
    "cupti-disable": ("cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);", "reaches the profiler (CUPTI)"),
    "cupti-flush": ("cuptiActivityFlushAll(0);", "reaches the profiler (CUPTI)"),
    "profiler-stop": ("cudaProfilerStop();", "reaches the profiler (CUPTI)"),
    # Threads, however spelled: work that runs on after forward returns is out of the timing's sight.
    "bare-thread": ("using namespace std; thread worker(work); worker.detach();", THREADS),
    "bare-thread-list": ("using namespace std; vector<thread> pool;", THREADS),
    "bare-async": ("using namespace std; auto done = async(launch::async, work);", THREADS),
    "thread-by-macro": ("#define WORKER thread\n  using namespace std; WORKER w(work);", THREADS),
    "spaced-thread": ("std :: thread t(work);", THREADS),
    "spliced-thread": ("std::thr\\\nead t(work);", THREADS),
    "thread-after-char-quote": ("char quote = '\"'; std::thread t(work); const char* s = \"\";", THREADS),
    "thread-between-digit-separators": ("int64_t a = 1'0; std::thread t(work); int64_t b = 2'0;", THREADS),
    "thread-pool": ("c10::ThreadPool pool(2);", THREADS),
    "host-function": ("cudaLaunchHostFunc(stream, work, nullptr);", THREADS),
    # Torch's functions under names no rule reads.
    "using-namespace-at": ("using namespace at; auto r = cpu::add(x, y);", UNQUALIFIED),
    "reopened-namespace": ("namespace at { Tensor twice(Tensor v) { return cpu::add(v, v); } }", UNQUALIFIED),
    "split-qualified-name": ("auto r = at::\n  cpu::add(x, y);", UNQUALIFIED),
    "using-declaration": ("using at::add; auto r = add(x, y);", "calls a torch operator"),
    "spaced-namespace": ("auto r = at :: cpu :: add(x, y);", "reaches past the dispatcher"),
    "redispatch": ("auto r = op.redispatch(x.key_set() & c10::after_ADInplaceOrView_keyset, x, y, 1);", "reaches past the dispatcher"),
    "dispatcher": ('auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");', "reaches past the dispatcher"),
}

NATIVE_ALLOWED = {
    "nothing": "// the launch goes here",
    "tensor-clone": "torch::Tensor copy = out.clone();",
    "table-to-device": "cudaMemcpyAsync(device_table, host_table, bytes, cudaMemcpyHostToDevice, stream);",
    "inline-ptx": 'asm volatile("membar.gl;");',
    "names-in-comments-and-strings": '// never PyEval_GetFrame(), fopen() or a syscall here\n  TORCH_CHECK(true, "no py::exec");',
    "side-stream-joined": ("cudaEventRecord(done, side);\n  cudaStreamWaitEvent(at::cuda::getCurrentCUDAStream(), done, 0);"),
    "variable-named-thread": "using namespace std; int thread = 3; if (thread < 4) { thread += 1; }",
    "threads-per-block": "using namespace std; int threads = 256; int threads_per_block = threads; __syncthreads();",
    "using-torch-tensor": "using torch::Tensor; Tensor copy = torch::empty_like(x);",
    "global-scope-call": "::memset(nullptr, 0, 0);",
    "digit-separators": "int64_t big = 1'000'000;",
    "macro-continuation": "#define IDENTITY(a) \\\n  (a)\n  int z = IDENTITY(1);",
}

HARNESS = "reaches around the harness"
CHANNEL = "touches the process, its environment, its descriptors or files"
FRAMES = "inspects the interpreter's objects, frames or modules"
PYTHON_CLOCK = "reads a clock"

# model_new.py lines (after `import os`, `import time` and torch's), each refused with the rule's message.
PYTHON_REFUSED = {
    "__main__": ("import __main__", HARNESS),
    "timing": ("import timing", HARNESS),
    "guards": ("from guards import Integrity", HARNESS),
    "io": ("import io", HARNESS),
    "posix": ("from posix import write", HARNESS),
    "input": ("line = input()", CHANNEL),
    "os.write": ("os.write(7, b'end:0')", CHANNEL),
    "os.fdopen": ("os.fdopen(7, 'w')", CHANNEL),
    "write_text": ("Path('/proc/self/fd/7').write_text('{}')", CHANNEL),
    "traceback-frames": ("frame = error.__traceback__.tb_frame.f_back", FRAMES),
    "perf_counter": ("start = time.perf_counter()", PYTHON_CLOCK),
    "from-time-import": ("from time import perf_counter_ns", PYTHON_CLOCK),
    "elapsed_time": ("ms = begin.elapsed_time(end)", PYTHON_CLOCK),
    "enable_timing": ("event = torch.cuda.Event(enable_timing=True)", PYTHON_CLOCK),
    "do_bench": ("from triton.testing import do_bench", PYTHON_CLOCK),
    "torch.multiprocessing": ("helper = torch.multiprocessing.get_context('spawn').Process(target=exec, args=(CODE,))",
                              "starts or reaches other processes"),
    "from-torch-import-distributed": ("from torch import distributed as dist", "starts or reaches other processes"),
    "from-torch-import-multiprocessing": ("from torch import multiprocessing", HARNESS),
    "load_inline": ("module = torch.utils.cpp_extension.load_inline('k', cpp_sources=SOURCE)", "compiles code at run time"),
    # Modules that reach around the harness, as attributes of modules that imported them: no import names them.
    "torch.ctypes": ("torch.ctypes.memmove(target, source, 32)", "through another module's attributes"),
    "dataloader-threading": ("torch.utils.data.dataloader.threading._start_new_thread(work, ())", "through another module's attributes"),
    "triton-subprocess": ("triton.knobs.subprocess.Popen(['python3', '-c', CODE])", "through another module's attributes"),
    "fx-operator": ("back = torch.fx.node.operator.attrgetter('f_' + 'back')", "through another module's attributes"),
    "serialization-io": ("maps = torch.serialization.io.FileIO('/proc/self/maps')", "through another module's attributes"),
    "import-operator": ("import operator", HARNESS),
    # Unpickled data and evaluated annotations call whatever they name.
    "torch.load": ("payload = torch.load('kernels/payload.pt', weights_only=False)", "loads objects or code from data"),
    "torch.package": ("importer = torch.package.PackageImporter('kernels/k.pt')", "loads objects or code from data"),
    "pkgutil": ("frame_of = pkgutil.resolve_name('sys:_getframe')", "loads objects or code from data"),
    "get_type_hints": ("hints = typing.get_type_hints(Hidden)", "loads objects or code from data"),
    # The interpreter's internals named in a string reach objects through format fields.
    "getattr-as-a-value": ("sys_module = next(map(getattr, [torch], ['sys']))", "uses reflection or dynamic code"),
    "torch-private": ("resolve = torch._utils._import_dotted_name", "torch's private modules"),
    "pydoc-locate": ("import pydoc", "a resolver of dotted names"),
    "fx-get-attr": ("graph = torch.fx.Graph()", "torch's graph machinery"),
    "aliased-multiprocessing": ("helper = torch.utils.data.dataloader.python_multiprocessing.Process()", "through another module's attributes"),
    "format-traversal": ("text = '{0.__traceback__.tb_frame.f_back.f_locals}'.format(error)", "names the interpreter's internals"),
    "from-cpp_extension": ("from torch.utils.cpp_extension import load", "compiles code at run time"),
    "cupti-python": ("from cupti import cupti", "inspects the profiler"),
    # numpy's and Python's arithmetic on a tensor's data, reached without importing numpy.
    "tensor-numpy": ("out = torch.from_numpy(x.numpy() + y.numpy())", "reads tensor data into Python or numpy"),
    "tolist": ("out = torch.tensor([max(a + b, 0.0) for a, b in zip(x.tolist(), y.tolist())])", "reads tensor data into Python or numpy"),
    "storage": ("first = x.untyped_storage()[0]", "reads tensor data into Python or numpy"),
    "array-interface": ("view = x.__array__()", "reads tensor data into Python or numpy"),
    "numpy-through-triton": ("np = triton.runtime.interpreter.np", "through another module's attributes"),
    "os-through-triton": ("o = triton.runtime.cache.os", "through another module's attributes"),
    "sys-aliased": ("import sys as s", "uses sys or os other than sys.path"),
    "sys-from-typing": ("from typing import sys as s", "uses sys or os other than sys.path"),
    "sys-as-a-value": ("modules = [sys][0]", "uses sys or os other than sys.path"),
    "custom-op": ("from torch.library import custom_op", "defines torch operators of its own"),
    "map2": ("out.map2_(x, y, lambda _, a, b: max(a + b, 0.0))", "runs Python on tensor elements"),
    "torch.save": ("torch.save(x, sink)", "loads objects or code from data"),
}

PYTHON_ALLOWED = {
    "os.path-and-reading": "HERE = os.path.dirname(__file__)\nSOURCE = Path(HERE, 'kernels', 'k.py').read_text()",
    "sys.path": "sys.path.insert(0, os.path.dirname(__file__))",
    "sleep": "time.sleep(0)",
    "tensor-select": "row = x.select(0, 1)",
    "format-of-shapes": "label = '{0}x{1}'.format(*x.shape)",
    "module-eval": "self.eval()",
    "variable-named-storage": "storage = torch.empty(16)",
    "side-stream-joined": "side.wait_stream(torch.cuda.current_stream())\ntorch.cuda.current_stream().wait_stream(side)",
}


def _native(tmp_path: Path, body: str) -> list[str]:
    snapshot = tmp_path / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text("import torch.nn as nn\n")
    (snapshot / "kernels" / "relu_add_binding.cpp").write_text(BINDING.format(body=body))
    return check_sources(snapshot)


def _python(tmp_path: Path, code: str) -> list[str]:
    (tmp_path / "model_new.py").write_text(f"import os\nimport time\nimport torch\nimport torch.nn as nn\n\n{code}\n")
    return check_sources(tmp_path)


@pytest.mark.parametrize("language", ["cuda", "cpp", "triton"])
def test_the_bundled_solutions_break_no_rule(language):
    assert check_sources(example_dir("relu_add") / "solutions" / language) == []


@pytest.mark.parametrize(("body", "rule"), NATIVE_REFUSED.values(), ids=NATIVE_REFUSED.keys())
def test_native_code_that_reaches_around_the_evaluator_is_refused_on_its_line(tmp_path, body, rule):
    violations = _native(tmp_path, body)
    assert any(rule in v and v.startswith("kernels/relu_add_binding.cpp:7 ") for v in violations), violations


@pytest.mark.parametrize("body", NATIVE_ALLOWED.values(), ids=NATIVE_ALLOWED.keys())
def test_native_code_an_honest_binding_needs_breaks_no_rule(tmp_path, body):
    assert _native(tmp_path, body) == []


@pytest.mark.parametrize(("code", "rule"), PYTHON_REFUSED.values(), ids=PYTHON_REFUSED.keys())
def test_python_that_reaches_the_harness_its_channel_frames_or_a_clock_is_refused(tmp_path, code, rule):
    violations = _python(tmp_path, code)
    assert any(rule in v and v.startswith("model_new.py:6 ") for v in violations), violations


@pytest.mark.parametrize("code", PYTHON_ALLOWED.values(), ids=PYTHON_ALLOWED.keys())
def test_python_an_honest_solution_may_write_breaks_no_rule(tmp_path, code):
    assert _python(tmp_path, code) == []


def test_the_message_names_the_rule_file_line_and_code(tmp_path):
    snapshot = tmp_path / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text("import torch.nn as nn\n")
    (snapshot / "kernels" / "other_binding.cpp").write_text("\n\nvoid f() { PyEval_GetFrame(); }\n")
    assert check_sources(snapshot) == [
        "kernels/other_binding.cpp:3 reaches into the Python interpreter (a binding only defines functions: "
        "`m.def(...)` with `pybind11::arg`): `PyEval_GetFrame(`"]
