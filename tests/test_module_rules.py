"""Rules on the built module (evaluators/module_rules.py) and on inline assembly in C++ sources
(static_rules.py), both reached through check_sources(snapshot).

The attacks: a CPython function (PyRun_SimpleString) or pthread_create declared under a harmless name
through an asm label, `.symver`, `weakref`, `#pragma redefine_extname`; a system call made by the
module's own instructions; a top-level asm block. Each is refused in the source where the text shows
it, and in the module (built for real with g++) whatever the source says. Honest builds made with the
workspace's own utils/build.py (the example solution, the honest cpp fixtures) pass every new rule.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import subprocess
import sys
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators import module_rules
from kernel_env.evaluators.static_rules import check_sources
from kernel_env.resources import data_dir, example_dir
from kernel_env.tasks.loaders import resolve_task
from kernel_env.workspace import Workspace

CANDIDATES = Path(__file__).parent / "candidates" / "cpp"
HONEST_CUDA_IMPORTS = Path(__file__).parent / "module_rules_honest_cuda_imports.txt"
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++ on this host: the module rules are tested on real builds")

LABEL = "under an assembler name (an asm label"
TOP_LEVEL = "has a top-level asm block"
MACRO = "hides asm in a macro"
RENAMES = "binds a symbol under another name"
KEYWORD = "redefines a C++ keyword"
ASM_SYSCALL = "makes system calls from inline assembly"
RUNS_PYTHON = "(runs or compiles Python code from C++"
THREADS = "(starts threads or processes"
SYSCALL_INSN = "the module's own machine code enters the kernel (`syscall`"

HONEST = '''\
#include <cstdint>
extern "C" void relu_add_cpu(const float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i] < 0.0f ? 0.0f : x[i] + y[i];
}
'''

# Each attack, as a whole kernels/ source: (source, what the source rules say, what the module rules say).
ATTACKS = {
    "asm-label-pyrun": ('''\
extern "C" int run_script(const char* source) __asm__("PyRun_SimpleString");
extern "C" int kernel_entry() { return run_script(R"(import sys; print(sys._getframe(1)))"); }
''', LABEL, "the module imports PyRun_SimpleString " + RUNS_PYTHON),
    "asm-label-pthread-create": ('''\
extern "C" int start_native(unsigned long*, const void*, void* (*)(void*), void*) __asm__("pthread_create");
static void* late(void*) { return nullptr; }
extern "C" int kernel_entry() { unsigned long handle; return start_native(&handle, nullptr, late, nullptr); }
''', LABEL, "the module imports pthread_create " + THREADS),
    "raw-syscall": ('''\
extern "C" long kernel_entry() {
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(39L) : "rcx", "r11", "memory");  // getpid; clone is 56
  return ret;
}
''', ASM_SYSCALL, SYSCALL_INSN),
    "symver": ('''\
extern "C" int start_old(unsigned long*, const void*, void* (*)(void*), void*);
__asm__(".symver start_old, pthread_create@GLIBC_2.2.5");
static void* late(void*) { return nullptr; }
extern "C" int kernel_entry() { unsigned long handle; return start_old(&handle, nullptr, late, nullptr); }
''', RENAMES, "the module imports pthread_create " + THREADS),
    "weakref": ('''\
static int run_script(const char*) __attribute__((weakref("PyRun_SimpleString")));
extern "C" int kernel_entry() { return run_script("import gc"); }
''', RENAMES, "the module imports PyRun_SimpleString " + RUNS_PYTHON),
    "redefine-extname": ('''\
#pragma redefine_extname run_script PyRun_SimpleString
extern "C" int run_script(const char*);
extern "C" int kernel_entry() { return run_script("import gc"); }
''', RENAMES, "the module imports PyRun_SimpleString " + RUNS_PYTHON),
    "top-level-asm": ('''\
__asm__(".text\\n.globl kernel_entry\\nkernel_entry:\\n  call PyRun_SimpleString@PLT\\n  ret\\n");
''', TOP_LEVEL, "the module imports PyRun_SimpleString " + RUNS_PYTHON),
    "asm-label-local": ('''\
extern "C" int kernel_entry() {
  extern int spawn(unsigned long*, const void*, void* (*)(void*), void*) asm("pthread_create");
  unsigned long handle;
  return spawn(&handle, nullptr, nullptr, nullptr);
}
''', LABEL, "the module imports pthread_create " + THREADS),
    "asm-label-std-thread": ('''\
#include <thread>
extern "C" void kernel_entry() { std::thread([] {}).detach(); }
''', "starts threads or processes", "std::thread::_M_start_thread"),
}

# Inline assembly that source text alone refuses (no build needed): (source, rule, line).
ASM_REFUSED = {
    "label-at-namespace-scope": ('namespace k {\nint f(const char*) __asm("PyRun_SimpleString");\n}\n', LABEL, 2),
    "label-on-a-variable": ('extern int marker asm("_Py_NoneStruct");\n', LABEL, 1),
    "label-after-noexcept": ('extern "C" int f(const char*) noexcept asm("PyRun_SimpleString");\n', LABEL, 1),
    "top-level-volatile": ('__asm__ volatile(".globl x");\n', TOP_LEVEL, 1),
    "top-level-in-extern-c": ('extern "C" {\nasm(".globl x");\n}\n', TOP_LEVEL, 2),
    "top-level-in-nested-namespaces": ('namespace a { namespace { asm("nop"); } }\n', TOP_LEVEL, 1),
    "top-level-after-a-macro": ('#define END ;\nint x END asm volatile(".globl y");\n', TOP_LEVEL, 2),
    "label-through-a-macro": ('#define NAMED(n) asm(n)\nint f(const char*) NAMED("PyRun_SimpleString");\n', MACRO, 1),
    "keyword-in-a-macro": ('#define ALIAS __asm__\nint f(const char*) ALIAS("PyRun_SimpleString");\n', MACRO, 1),
    "macro-over-two-lines": ('#define NAMED(n) \\\n  __asm__(n)\n', MACRO, 1),
    "keyword-redefined": ('#define while f\n', KEYWORD, 1),
    "symver-in-a-function-body": ('void f() { asm volatile(".symver g, pthread_create@GLIBC_2.2.5"); }\n', RENAMES, 1),
    "symver-attribute": ('__attribute__((symver("pthread_create@GLIBC_2.2.5"))) int f();\n', RENAMES, 1),
    "pragma-weak": ('#pragma weak run = PyRun_SimpleString\n', RENAMES, 1),
    "_Pragma-redefine-extname": ('_Pragma("redefine_extname run PyRun_SimpleString")\n', RENAMES, 1),
}

# Inline assembly honest kernels write: none of it is refused.
ASM_ALLOWED = {
    "ptx-extended": '__device__ unsigned lane() { unsigned r; asm volatile("mov.u32 %0, %%laneid;" : "=r"(r)); return r; }\n',
    "compiler-barrier": 'void f() { asm volatile("" ::: "memory"); }\n',
    "bare-statements": ('__global__ void k(float* o) {\n  asm("membar.gl;");\n  if (o) asm("trap;"); else asm("exit;");\n'
                        '  for (;;) asm("nop");\n}\n'),
    "switch-labels": 'void f(int x) { switch (x) { case 1: asm("nop"); break; default: asm("nop"); } }\n',
    "asm-goto": 'void f() { asm goto("jmp %l0" :::: out); out: return; }\n',
    "macro-volatile": '#define BAR_SYNC() asm volatile("bar.sync 0;" ::: "memory")\n__device__ void f() { BAR_SYNC(); }\n',
    "lambda-at-namespace-scope": 'auto g = [](int x) { asm volatile(""); return x; };\n',
    "member-functions": ('struct S {\n  int a;\n  S() : a{1} { asm("nop"); }\n  void f() const { __asm__ __volatile__(""); }\n};\n'),
    "template-function": ('template <class T> struct W { T v; };\ntemplate <class T> void f(W<T>& w) {\n'
                          '  asm volatile("" : : "r"(&w) : "memory");\n}\n'),
    "nested-namespaces": 'namespace a { namespace { __device__ void f() { asm("nop"); } } }\n',
    "extern-c-function": 'extern "C" __global__ void k() { asm volatile("exit;"); }\n',
    "pragma-unroll": '#define UNROLL _Pragma("unroll")\n__device__ void f(float* o) { UNROLL for (int i = 0; i < 4; ++i) o[i] = 0; }\n',
    "include-asm-folder": '#include <asm/byteorder.h>\nvoid f() {}\n',
}


def _gxx(tmp_path: Path, source: str, name: str = "cuda_extension.so") -> Path:
    """A shared object built from ``source`` with plain g++ (no torch headers: the point is the module's symbols)."""
    src = tmp_path / f"{hashlib.sha256(source.encode()).hexdigest()[:12]}.cpp"
    src.write_text(source)
    out = tmp_path / "modules" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([GXX, "-O2", "-fPIC", "-shared", "-std=c++17", str(src), "-o", str(out)], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"g++ failed:\n{source}\n{proc.stderr}"
    return out


def _snapshot(root: Path, kernels: dict[str, str], module: Path | None = None, model: str = "import torch.nn as nn\n") -> Path:
    snapshot = root / f"snapshot-{len(list(root.glob('snapshot-*')))}"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text(model)
    for name, text in kernels.items():
        (snapshot / "kernels" / name).write_text(text)
    if module is not None:
        (snapshot / "build").mkdir()
        shutil.copy2(module, snapshot / "build" / module.name)
    return snapshot


def _module_only(violations: list[str]) -> list[str]:
    return [v for v in violations if v.startswith("build/")]


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    """Each test judges its modules afresh (the verdicts are remembered by the module's hash, a missing
    tool is warned of once)."""
    monkeypatch.setattr(module_rules, "_CACHE", OrderedDict())
    monkeypatch.setattr(module_rules, "_WARNED", set())


# ------------------------------------------------------------------------------ attacks


@needs_gxx
@pytest.mark.parametrize(("source", "source_rule", "module_rule"), ATTACKS.values(), ids=ATTACKS.keys())
def test_an_attack_is_refused_in_its_source_and_in_its_module(tmp_path, source, source_rule, module_rule):
    violations = check_sources(_snapshot(tmp_path, {"attack.cpp": source}, _gxx(tmp_path, source)))
    assert any(v.startswith("kernels/attack.cpp:") and source_rule in v for v in violations), violations
    assert any(v.startswith("build/cuda_extension.so: ") and module_rule in v for v in violations), violations


@needs_gxx
@pytest.mark.parametrize(("source", "module_rule"), [(s, m) for s, _, m in ATTACKS.values()], ids=ATTACKS.keys())
def test_a_module_built_from_other_sources_is_judged_by_what_it_is(tmp_path, source, module_rule):
    # The snapshot's sources are innocent; the module was built from the attack (the agent controls build/).
    violations = check_sources(_snapshot(tmp_path, {"relu_add.cpp": HONEST}, _gxx(tmp_path, source)))
    assert violations and all(v.startswith("build/cuda_extension.so: ") for v in violations), violations
    assert any(module_rule in v for v in violations), violations


@needs_gxx
def test_the_message_names_the_module_the_symbol_and_why(tmp_path):
    source = ATTACKS["asm-label-pyrun"][0]
    violations = _module_only(check_sources(_snapshot(tmp_path, {}, _gxx(tmp_path, source))))
    assert violations == [("build/cuda_extension.so: the module imports PyRun_SimpleString (runs or compiles Python "
                           "code from C++, past every rule on model_new.py)")]


@pytest.mark.parametrize(("source", "rule", "line"), ASM_REFUSED.values(), ids=ASM_REFUSED.keys())
def test_asm_that_hides_a_name_or_lives_outside_functions_is_refused_on_its_line(tmp_path, source, rule, line):
    violations = check_sources(_snapshot(tmp_path, {"k.cu": source}))
    assert any(rule in v and v.startswith(f"kernels/k.cu:{line} ") for v in violations), violations


@pytest.mark.parametrize("source", ASM_ALLOWED.values(), ids=ASM_ALLOWED.keys())
def test_inline_asm_statements_in_function_bodies_break_no_rule(tmp_path, source):
    assert check_sources(_snapshot(tmp_path, {"k.cu": source})) == []


@needs_gxx
def test_the_honest_inline_asm_builds_into_a_module_that_breaks_no_rule(tmp_path):
    # The host-side forms of ASM_ALLOWED, compiled (each in a namespace of its own): barriers and bare
    # statements import nothing refused and make no system call.
    host = ("compiler-barrier", "switch-labels", "asm-goto", "member-functions", "template-function")
    source = ASM_ALLOWED["include-asm-folder"].replace("void f() {}", "")
    source += 'void bare(int x) {\n  asm("nop");\n  if (x) asm("nop"); else asm("nop");\n  while (x--) asm("nop");\n}\n'
    source += "".join(f"namespace n{i} {{\n{ASM_ALLOWED[name].replace('__global__ ', '')}}}\n" for i, name in enumerate(host))
    source += "template void n4::f<int>(n4::W<int>&);\nn3::S s_instance;\n"
    assert check_sources(_snapshot(tmp_path, {"k.cpp": source}, _gxx(tmp_path, source))) == []


# ------------------------------------------------------------------------------ the reader itself


@needs_gxx
def test_the_symbol_reader_agrees_with_nm(tmp_path):
    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils) here to compare with")
    module = _gxx(tmp_path, ATTACKS["symver"][0] + ATTACKS["weakref"][0].replace("kernel_entry", "entry2"))
    listed = subprocess.run(["nm", "-D", "--undefined-only", str(module)], capture_output=True, text=True, check=True).stdout
    assert module_rules.undefined_symbols(module.read_bytes()) == {line.split()[-1].split("@")[0] for line in listed.splitlines()}


def test_a_file_that_is_not_an_elf_shared_object_is_refused(tmp_path):
    snapshot = _snapshot(tmp_path, {})
    (snapshot / "build").mkdir()
    (snapshot / "build" / "cuda_extension.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 20)
    (violations,) = check_sources(snapshot)
    assert violations.startswith("build/cuda_extension.so: the harness cannot read the module as an ELF shared object")


@needs_gxx
def test_a_module_behind_a_symbolic_link_is_not_followed(tmp_path):
    module = _gxx(tmp_path, HONEST)
    snapshot = _snapshot(tmp_path, {})
    (snapshot / "build").mkdir()
    (snapshot / "build" / "cuda_extension.so").symlink_to(module)
    (violation,) = check_sources(snapshot)
    assert violation.startswith("build/cuda_extension.so: the harness cannot read the module")


@needs_gxx
def test_without_objdump_the_imports_are_still_read_and_the_code_check_is_logged_as_skipped(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(module_rules.shutil, "which", lambda name: None)
    source = ATTACKS["raw-syscall"][0] + ATTACKS["asm-label-pyrun"][0].replace("kernel_entry", "entry2")
    with caplog.at_level(logging.WARNING, logger=module_rules.__name__):
        violations = _module_only(check_sources(_snapshot(tmp_path, {}, _gxx(tmp_path, source))))
    assert violations == [("build/cuda_extension.so: the module imports PyRun_SimpleString (runs or compiles Python "
                           "code from C++, past every rule on model_new.py)")]
    assert "objdump (binutils) is not installed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=module_rules.__name__):
        check_sources(_snapshot(tmp_path, {}, _gxx(tmp_path, HONEST)))
    assert "objdump" not in caplog.text  # once per process


@needs_gxx
def test_executable_bytes_outside_every_section_are_refused(tmp_path):
    # A module whose section table no longer covers its code (.text's size set to 0): objdump -d would
    # read nothing of it, the loader would still map and run it.
    data = bytearray(_gxx(tmp_path, ATTACKS["raw-syscall"][0]).read_bytes())
    if data[4] != 2 or data[5] != 1:
        pytest.skip("the test edits 64-bit little-endian ELF files only")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_at = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        header = shoff + i * shentsize
        name = data[names_at + struct.unpack_from("<I", data, header)[0]:].split(b"\0", 1)[0]
        if name == b".text":
            struct.pack_into("<Q", data, header + 0x20, 0)
    module = tmp_path / "edited" / "cuda_extension.so"
    module.parent.mkdir()
    module.write_bytes(bytes(data))
    violations = _module_only(check_sources(_snapshot(tmp_path, {}, module)))
    assert any("executable bytes in no section" in v for v in violations), violations
    assert not any(SYSCALL_INSN in v for v in violations)  # objdump no longer sees it: the reason for the check


def test_an_honest_cuda_modules_imports_are_all_allowed():
    # `nm -D --undefined-only` of examples/relu_add/solutions/cuda (plus a .cu with PTX inline asm) built by
    # utils/build.py with nvcc 13.0 and torch 2.11 on an H200 host: cudart, pybind11, torch, libstdc++, libc.
    names = [line for line in HONEST_CUDA_IMPORTS.read_text().splitlines() if line and not line.startswith("#")]
    assert len(names) > 200
    refused = [(name, why) for name in names for pattern, why in module_rules._REFUSED if pattern.fullmatch(name)]
    assert refused == []


def test_openmp_and_pybind11s_interpreter_calls_are_allowed_and_the_dangerous_neighbours_are_not():
    def refused(name: str) -> bool:
        return any(pattern.fullmatch(name) for pattern, _ in module_rules._REFUSED)
    allowed = ["GOMP_parallel", "GOMP_barrier", "omp_get_thread_num", "omp_get_num_threads", "PyEval_GetBuiltins",
               "PyEval_SaveThread", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyFrame_GetBack", "PyFrame_GetCode",
               "PyFrame_GetLineNumber", "PyGILState_Ensure", "PyGILState_Release", "PyThreadState_New",
               "PyThreadState_Get", "PyThreadState_Clear", "PyThreadState_DeleteCurrent", "_PyThreadState_UncheckedGet",
               "PyInterpreterState_Get", "PyInterpreterState_Main", "PyThread_tss_create", "pthread_mutex_lock",
               "pthread_self", "sched_yield", "nanosleep", "usleep", "malloc", "_dl_find_object", "__cxa_guard_acquire",
               "_ZNSt6thread4joinEv", "_ZNSt6thread20hardware_concurrencyEv", "cudaLaunchKernel", "PyObject_GetAttrString"]
    denied = ["PyRun_SimpleString", "PyRun_StringFlags", "Py_CompileString", "PyEval_EvalCode", "PyEval_GetFrame",
              "PyEval_GetGlobals", "PyEval_GetLocals", "PyEval_GetFrameLocals", "PyImport_ImportModule", "PyImport_AddModule",
              "PySys_GetObject", "PyFrame_GetLocals", "PyFrame_GetGlobals", "PyCode_GetVarnames", "PyMarshal_ReadObjectFromString",
              "Py_Initialize", "PyThreadState_GetFrame", "PyThreadState_SetAsyncExc", "PyThread_start_new_thread",
              "Py_AddPendingCall", "PyEval_SetProfile", "PyEval_SetTrace", "pthread_create", "thrd_create", "clone", "clone3",
              "fork", "vfork", "execve", "execvp", "execl", "posix_spawn", "posix_spawnp", "system", "popen", "dlopen",
              "dlmopen", "dlsym", "dlvsym", "__libc_dlopen_mode", "dl_iterate_phdr", "syscall", "mprotect", "timer_create",
              "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE"]
    assert [name for name in allowed if refused(name)] == []
    assert [name for name in denied if not refused(name)] == []


# ------------------------------------------------------------------------------ honest builds (utils/build.py)


def _compile_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TORCH_CUDA_ARCH_LIST")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    return env


# The fixtures' own binding translation unit includes every fixture, attacks among them; these builds
# take the sources that some fixtures list and a binding unit of their own instead.
_FIXTURE_BUILDS = {
    "honest-fixtures": ("misc_fixture.h", ["register_misc"]),
    "asm-label-fixtures": ("asm_label_pyrun_fixture.h asm_label_thread_fixture.h",
                           ["register_asm_label_pyrun", "register_asm_label_thread"]),
}


def _workspace_build(cache: Path, scratch: Path, name: str) -> Path:
    """The module utils/build.py makes of the example solution or of a group of cpp fixtures (cached by inputs)."""
    template = data_dir("workspace_template")
    if name == "example":
        inputs = sorted((example_dir("relu_add") / "solutions" / "cpp" / "kernels").iterdir())
        binding = None
    else:
        headers, registers = _FIXTURE_BUILDS[name]
        inputs = [CANDIDATES / "kernels" / n for n in ("relu_add.cpp", "check.h", *headers.split())]
        binding = ("#include \"check.h\"\n#include \"../binding_registry.h\"\n"
                   + "".join(f'#include "{h}"\n' for h in headers.split())
                   + "static void register_all(pybind11::module& m) {\n" + "".join(f"  {r}(m);\n" for r in registers)
                   + "}\nREGISTER_BINDING(fixtures, register_all);\n")
    digest = hashlib.sha256(f"{torch.__version__}\0{name}\0{binding}".encode())
    for path in [*inputs, template / "binding.cpp", template / "binding_registry.h", *sorted((template / "utils").glob("build*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    target = cache / f"{name}-{digest.hexdigest()[:16]}"
    built = list(target.glob("cuda_extension*.so"))
    if built:
        return built[0]
    ws = Workspace.create(resolve_task("example/relu_add"), "cpp", root=scratch / name)
    try:
        if name == "example":
            ws.copy_solution(example_dir("relu_add") / "solutions" / "cpp")
        else:
            shutil.rmtree(ws.path / "kernels")
            (ws.path / "kernels").mkdir()
            for path in inputs:
                shutil.copy2(path, ws.path / "kernels" / path.name)
            (ws.path / "kernels" / "fixtures_binding.cpp").write_text(binding)
        proc = subprocess.run(["bash", "utils/compile.sh"], check=False, cwd=ws.path, env=_compile_env(),
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{name} did not build:\n{proc.stdout}\n{proc.stderr}"
        so = next((ws.path / "build").glob("cuda_extension*.so"))
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, target / so.name)
        return target / so.name
    finally:
        ws.destroy()


@pytest.fixture(scope="module")
def workspace_builds(pytestconfig, tmp_path_factory) -> dict[str, Path]:
    if GXX is None:
        pytest.skip("no g++ on this host")
    cache = Path(pytestconfig.cache.mkdir("module-rules-builds")) if getattr(pytestconfig, "cache", None) else \
        tmp_path_factory.mktemp("module-rules-builds")
    scratch = tmp_path_factory.mktemp("module-rules-ws")
    names = ["example", *_FIXTURE_BUILDS]
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(lambda n: _workspace_build(cache, scratch, n), names)))


def _fixture_snapshot(root: Path, fixture: str, module: Path) -> Path:
    """A snapshot as tests/test_evaluation.py makes one: the fixture as model_new.py, the kernels its
    `# kernels:` line lists, and the module."""
    from test_evaluation import cpp_sources, fixture_headers, fixtures_binding

    source = CANDIDATES / f"{fixture}.py"
    kernels = {n: (CANDIDATES / "kernels" / n).read_text() for n in cpp_sources(fixture)}
    kernels["fixtures_binding.cpp"] = fixtures_binding(fixture_headers(fixture, "kernels"))
    return _snapshot(root, kernels, module, model=source.read_text())


@pytest.mark.slow  # the module's workspace builds: 33 s
def test_the_example_solution_built_by_the_workspace_breaks_no_rule(workspace_builds, tmp_path):
    snapshot = tmp_path / "solution"
    shutil.copytree(example_dir("relu_add") / "solutions" / "cpp", snapshot)
    (snapshot / "build").mkdir()
    shutil.copy2(workspace_builds["example"], snapshot / "build")
    assert check_sources(snapshot) == []
    # What it imports from OpenMP and CPython (through pybind11) is what the denylist leaves alone.
    imports = module_rules.undefined_symbols(workspace_builds["example"].read_bytes())
    assert "GOMP_parallel" in imports and "PyEval_GetBuiltins" in imports and "PyGILState_Ensure" in imports


@pytest.mark.slow  # the module's workspace builds: 33 s
@pytest.mark.parametrize("fixture", sorted(p.stem for p in CANDIDATES.glob("*.py")
                                           if "misc_fixture.h" in p.read_text().split("# kernels:", 1)[1].split("\n")[0]))
def test_the_cpp_fixtures_on_misc_kernels_break_no_new_rule(workspace_builds, tmp_path, fixture):
    # honest, slow_honest and the attacks on the harness's run-time checks (uninit, inplace, cache_by_ptr,
    # lazy_output, ...) all run misc_fixture.h's code: their module and their kernels break no module or asm rule.
    violations = check_sources(_fixture_snapshot(tmp_path, fixture, workspace_builds["honest-fixtures"]))
    assert [v for v in violations if v.startswith(("build/", "kernels/"))] == []
    if fixture in ("honest", "slow_honest"):
        assert violations == []


@pytest.mark.slow  # the module's workspace builds: 33 s
@pytest.mark.parametrize(("fixture", "source_rule", "module_rule"), [
    ("asm_label_pyrun", LABEL, "the module imports PyRun_SimpleString " + RUNS_PYTHON),
    ("asm_label_thread", LABEL, "the module imports pthread_create " + THREADS),
])
def test_the_asm_label_fixtures_are_refused_by_source_and_by_module(workspace_builds, tmp_path, fixture, source_rule, module_rule):
    violations = check_sources(_fixture_snapshot(tmp_path, fixture, workspace_builds["asm-label-fixtures"]))
    assert any(v.startswith(f"kernels/{fixture}_fixture.h:") and source_rule in v for v in violations), violations
    assert any(v.startswith("build/cuda_extension") and module_rule in v for v in violations), violations
