"""Source rules checked before a candidate runs (trusted side; reads the snapshot as text).

The run-time audit sees torch compute during the correctness trials. What it cannot see is
code that notices it is being audited, profiled or timed and behaves differently, or code
that reaches into the process around it. Honest kernels never need any of that, so the
tools for it are refused outright, by name, with the file and line. What the built module itself
imports and executes is checked as well (module_rules.py): C++ can name a function where no text
rule reads it.
"""

from __future__ import annotations

import bisect
import io
import re
import tokenize
from pathlib import Path

from kernel_env.evaluators.module_rules import check_module

# Python: introspection of the harness, the dispatcher, the profiler, the interpreter. Honest
# kernels need none of it; the reflection primitives are refused because each is a way to
# reach harness objects without naming them.
_PYTHON_RULES: tuple[tuple[str, str], ...] = (
    (r"_python_dispatch|TorchDispatchMode|TorchFunctionMode|_get_current_dispatch_mode|_get_dispatch_mode|"
     r"_len_torch_dispatch_stack|is_torch_function_mode_enabled|_is_torch_function_mode_enabled|DispatchKey|_dispatch_tls",
     "inspects torch dispatch modes (the harness's audit)"),
    (r"_is_profiler_enabled|torch\.profiler|autograd\.profiler|_kineto|\bcupti", "inspects the profiler"),
    (r"torch\.compile\b|torch\._dynamo|torch\._inductor|torch\.jit\.(script|trace)|torch\._C\b|torch\.ops\b|torch\._ops\b",
     "uses torch internals or a torch compiler (kernels must be your own)"),
    (r"\bgc\b|sys\._getframe|\bsys\.(?!path\b)\w+|\binspect\b|\btraceback\b|__traceback__|"
     r"\b(?:tb_frame|tb_next|f_back|f_locals|f_globals|f_builtins|gi_frame|cr_frame|ag_frame)\b",
     "inspects the interpreter's objects, frames or modules"),
    (r"^[ \t]*(import|from)\s+[^\n]*?\b(ctypes|_ctypes|threading|_thread|multiprocessing|concurrent|signal|importlib|builtins|"
     r"subprocess|socket|asyncio|mmap|resource|faulthandler|atexit|weakref|pickle|marshal|code|runpy|sys|gc|inspect|"
     r"numpy|scipy|cupy|jax|numba|_C|__main__|timing|guards|runner|zygote|compare|screen|kernel_env|io|_io|posix|fcntl|"
     r"pty|select|selectors|_socket|_hashlib|hmac|operator|types)\b(?<!\bsys\b)|^[ \t]*from\s+sys\s+import\b|\b_C\b|\b__main__\b",
     "imports a module or internal that reaches around the harness or computes outside your kernels "
     "(threads, processes, ctypes, importlib, sys internals, the harness's own modules, raw I/O, torch._C, "
     "numpy, ...)"),
    # The same modules reached as attributes of modules that imported them (torch.ctypes, torch.cuda.graphs.gc,
    # torch.utils.data.dataloader.threading, triton.knobs.subprocess, torch.fx.node.operator, ...): no import names them.
    (r"\.\s*(?:ctypes|_ctypes|gc|inspect|sys|builtins|importlib|io|_io|pickle|marshal|subprocess|threading|_thread|"
     r"multiprocessing|concurrent|traceback|socket|_socket|mmap|posix|fcntl|pty|resource|faulthandler|atexit|weakref|"
     r"runpy|asyncio|operator|types|hmac|_hashlib|signal|mp|python_multiprocessing|reducer|np|os)\b(?!\s*\()",
     "reaches a module that reaches around the harness through another module's attributes (torch.ctypes, "
     "torch.cuda.graphs.gc, ...)"),
    # The builtins, called or passed on as values (map(getattr, [torch], [name]): the name in a string no rule
    # reads); methods of the same name (module.eval()) are not them.
    (r"(?<![\w.])(?:__import__|globals|locals|vars|eval|exec|compile|getattr|setattr|delattr|breakpoint)\b",
     "uses reflection or dynamic code (getattr/setattr/eval/exec/globals/vars/__import__)"),
    # Torch's private modules resolve dotted names from strings, import, and reach the interpreter;
    # pydoc.locate resolves any dotted name.
    (r"\btorch\s*\.\s*_\w+|^[ \t]*from\s+torch\._|\bpydoc\b",
     "uses torch's private modules or a resolver of dotted names (torch._utils, torch._ops, pydoc.locate, ...)"),
    # FX graphs call methods and fetch attributes by name (call_method, get_attr): getattr by string.
    (r"\btorch\s*\.\s*(?:fx|export)\b|^[ \t]*from\s+torch\s+import\s+[^\n]*\b(?:fx|export)\b",
     "uses torch's graph machinery (torch.fx, torch.export), which reaches attributes by name"),
    (r"\.__(dict|globals|class|bases|mro|subclasses|code|closure|builtins|func|self|wrapped|module|getattribute|setattr|init_subclass)__\b|\b__builtins__\b",
     "reaches into objects through dunder attributes"),
    (r"^[ \t]*(torch|time|triton|math|os|sys)(\.\w+)+\s*=[^=]", "replaces attributes of torch, time, triton or the standard library"),
    # A clock lets code time its own calls and behave by what it sees (a busy machine, a call through
    # another path); timing is the harness's job.
    (r"\btime\.(?!sleep\b)\w+|\b(?:perf_counter|monotonic|process_time|thread_time|clock_gettime)\w*\b|\bdatetime\b|"
     r"\belapsed_time\b|\benable_timing\b|\bdo_bench\w*\b|\btimeit\b|^[ \t]*from\s+time\s+import\b",
     "reads a clock (timing is the evaluator's job)"),
    (r"\bos\.(?!path\b)\w+|\bopen\s*\(|\.\s*(?:write_text|write_bytes)\s*\(|\binput\s*\(",
     "touches the process, its environment, its descriptors or files (os.environ, os.write, open, input, ...)"),
    # A process of its own has a CUDA context of its own, which the timing's device-wide
    # synchronise does not wait for (the run-time process watch backs this up).
    (r"\btorch\s*\.\s*(?:multiprocessing|distributed)\b|^[ \t]*from\s+torch\s+import\s+[^\n]*\b(?:multiprocessing|distributed)\b",
     "starts or reaches other processes (torch.multiprocessing, torch.distributed); kernels run in the evaluated process"),
    # C++ compiled from a Python string would pass every rule on kernels/ unread.
    (r"\bcpp_extension\b|\bload_inline\b",
     "compiles code at run time (build C++/CUDA with utils/compile.sh, where kernels/ is checked)"),
    # Unpickling calls whatever the data names (getattr, sys._getframe, ...), and string annotations
    # are evaluated by typing: both run code whose names no rule here reads.
    (r"\btorch\s*\.\s*(?:load|save|package|hub|serialization)\b|^[ \t]*from\s+torch\s+import\s+[^\n]*\b(?:load|save|package|hub|serialization)\b|"
     r"\bweights_only\b|\b(?:pkgutil|cloudpickle|dill|shelve|joblib|copyreg|get_type_hints|ForwardRef|singledispatch\w*)\b",
     "loads objects or code from data (torch.load, torch.package, torch.hub, pickle's relatives, evaluated annotations)"),
)
_PYTHON_RULES += (
    # sys and os are allowed for sys.path and os.path alone: as values under other names (`import sys as s`,
    # `from typing import sys`, `s = sys`) they are the interpreter's modules and the process's environment.
    (r"^(?![ \t]*import[ \t]+(?:sys|os)[ \t]*$)[^\n]*?(?<![\w.])(?:sys|os)\b(?![ \t]*\.[ \t]*path\b)",
     "uses sys or os other than sys.path and os.path (`import sys` / `import os`, then `sys.path` / `os.path` only)"),
    # The dispatch audit judges an operator by its name; a custom operator's body runs out of its sight.
    (r"\btorch\s*\.\s*library\b|^[ \t]*from\s+torch\s+import\s+[^\n]*\blibrary\b|\bcustom_op\b|\btriton_op\b",
     "defines torch operators of its own (torch.library): the audit cannot see inside them; call your kernels directly"),
    # Python callables run element by element by torch's C++ loops, past the audit.
    (r"\.\s*(?:map_|map2_|apply_)\b", "runs Python on tensor elements (Tensor.map_/map2_/apply_); compute in your own kernels"),
    # The run-time audit sees torch's operators; numpy's and Python's arithmetic on a tensor's data
    # (reached without importing numpy: x.numpy(), x.tolist()) it does not.
    (r"\.\s*(?:numpy|tolist)\b|\bfrom_numpy\b|\bdlpack\b|__(?:array\w*|dlpack\w*|cuda_array_interface)__|"
     r"\.\s*(?:untyped_storage|_typed_storage|storage)\b|\bmemoryview\b|\bfrombuffer\b",
     "reads tensor data into Python or numpy (x.numpy(), x.tolist(), storages, DLPack); compute in your own kernels"),
)
# Python checked with string literals kept: the interpreter's internals named in a string reach objects
# all the same, through format fields ("{0.__traceback__.tb_frame}".format(e)) or data that is unpickled.
_PYTHON_RAW_RULES: tuple[tuple[str, str], ...] = (
    (r"__(?:traceback|globals|class|dict|subclasses|mro|bases|builtins|code|closure|getattribute|self|func|wrapped)__|"
     r"\b(?:f_back|f_locals|f_globals|f_builtins|tb_frame|tb_next|gi_frame|cr_frame|ag_frame|_getframe|_current_frames)\b",
     "names the interpreter's internals, in code or in a string (format fields and unpickled data reach objects by name)"),
)
_RENAMES = ("binds a symbol under another name (`.symver`, the symver/weakref attributes, `#pragma weak` or "
            "`redefine_extname`): the function it calls is hidden from these rules; call functions by their own names")
_THREADS = ("starts threads or processes, or loads code at run time: work that runs on after forward returns is "
            "out of the timing's sight (parallelise with OpenMP: `#pragma omp parallel for`)")
# With `using namespace std`, std::thread is `thread`: declared, constructed, listed or aliased by a macro.
_BARE_THREADS = (r"(?<![\w:.>])(?:j?thread\b\s*(?:[({]|[A-Za-z_]\w*\s*[({;=])|async\s*\()|<\s*j?thread\s*>|"
                 r"^[ \t]*#[ \t]*define\b[^\n]*\b(?:j?thread|async)\b")
# C++/CUDA: torch operators (compute), the dispatcher's state, threads, run-time loading.
_NATIVE_RULES: tuple[tuple[str, str], ...] = (
    (r"DispatchModeTLS|PythonTLSSnapshot|TorchFunctionMode|ThreadLocalState|impl::tls_|DispatchKey|ExcludeDispatchKeyGuard|"
     r"IncludeDispatchKeyGuard|AutoDispatchBelow\w*|at::_ops::|at::native::|at::cpu::|at::cuda::(?!getCurrentCUDAStream|"
     r"getCurrentCUDABlasHandle|CUDAGuard|OptionalCUDAGuard|getDefaultCUDAStream|CUDAStream)|"
     r"\bnamespace\s+\w+\s*=\s*(::)?(at|torch|c10)\b|##|\bDispatcher\b|\bredispatch\w*|\bfindSchema\w*|\bfindOp\b|"
     r"\bkey_set\b|_keyset\b|\bOperatorHandle\b|\bcallBoxed\b|\bBoxedKernel\b|\bKernelFunction\b",
     "reaches past the dispatcher or into its thread-local state"),
    # Names of torch's own namespaces used unqualified (`using namespace at; cpu::add(x, y)`, code inside a
    # reopened `namespace at {`) are torch's functions under names no rule here reads.
    (r"\busing\s+namespace\s+(?:::)?(?:at|torch|c10|caffe2)\b|\bnamespace\s+(?:::)?(?:at|torch|c10|caffe2)\b(?!\s*=)|"
     r"::[ \t]*\n|\w[ \t]*\n[ \t]*::",
     "names torch's functions without their namespace (a using-directive for at/torch/c10, code inside their "
     "namespaces, or a qualified name split across lines); spell torch names in full, on one line: torch::empty_like"),
    (r"\bdlopen\s*\(|\bdlsym\s*\(|\bfork\s*\(|\bsystem\s*\(|\bpopen\s*\(|\bposix_spawn\w*\s*\(|"
     r"\bstd::(?:thread|jthread|async)\b|pthread_create|\bthrd_create\b|\w*ThreadPool\w*|\b(?:at|c10)::(?:launch|intraop_launch)\w*|"
     r"\bcu(?:da)?(?:LaunchHostFunc|StreamAddCallback)\b",
     _THREADS),
    # Code of the candidate's must not subscribe to, stop or flush CUPTI, the profilers' device record (nor start
    # and stop external profilers).
    (r"\bcupti\w*|\bCUpti\w*|\bcu(?:da)?Profiler(?:Start|Stop|Initialize)\b",
     "reaches the profiler (CUPTI), which the evaluator's device record uses"),
    (r"\bcudaIpc\w+|\bcuIpc\w+|\bcuMem(?:Export|Import)\w*",
     "shares device memory with other processes (CUDA IPC); kernels run in the evaluated process"),
    # A binding defines functions (`m.def(...)`, `pybind11::arg`) and nothing more: from C++ the
    # interpreter is as open as from Python (frames, modules, the harness's objects), past every
    # Python rule above, so reaching into it is refused by name.
    (r"\b_?Py[A-Z][A-Za-z]*_\w*\s*\(|\b_Py\w+|\bPy_\w+|\bPyObject\b|\bPyFrameObject\b|"
     r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*)?(?:import|eval\w*|exec\w*|globals|getattr|setattr|hasattr|"
     r"delattr|reinterpret_borrow|reinterpret_steal|module_?_?\s*::\s*import)\b|\.\s*attr\s*\(|\bimport\s*\(",
     "reaches into the Python interpreter (a binding only defines functions: `m.def(...)` with `pybind11::arg`)"),
    (r"\bcudaMemcpy\w*DeviceToHost\b|\bcudaMemcpyDefault\b|\bcuMemcpyDtoH\w*|\bcudaMemcpyFromSymbol\w*|\bcudaMallocHost\b|"
     r"\bcudaHostAlloc\b|\bcudaHostRegister\b|\bcudaMallocManaged\b|\bcudaHostGetDevicePointer\b|\.\s*cpu\s*\(",
     "moves data from the GPU to the host or maps host memory (the outputs must be computed on the device)"),
    (r"std::chrono|\b(?:clock_gettime|gettimeofday|__rdtsc|rdtsc|cudaEventElapsedTime|clock|clock64|time)\s*\(",
     "reads a clock (timing is the evaluator's job)"),
    (r"\b(?:fopen|freopen|fdopen|open|openat|creat|mmap|mprotect|ptrace|process_vm_\w+|syscall|prctl|vfork|execv\w*|execl\w*|"
     r"symlink\w*|link|linkat|mkfifo\w*|mknod\w*|unlink\w*|rename\w*|unshare|setns|mount|umount2?|chroot|pivot_root)\s*\(|"
     r"(?<![.>\w])(?:clone|read|write|pread\w*|pwrite\w*|readv|writev|send|sendto|sendmsg|recv|recvfrom|recvmsg|ioctl|dup[23]?)\s*\(|"
     r"\bstd::[io]?fstream\b",
     "touches files, file descriptors, memory mappings or the process itself (open, read/write, mmap, syscall, ...)"),
    # The same outside strings: the symver and weakref attributes, `#pragma weak` and `#pragma redefine_extname`.
    (r"\b_*(?:symver|weakref)_*\b|^[ \t]*#[ \t]*pragma[ \t]+(?:weak|redefine_extname)\b", _RENAMES),
)
# Checked with string literals kept: inline assembly that enters the kernel (PTX has no such instruction).
_NATIVE_RAW_RULES: tuple[tuple[str, str], ...] = (
    (r"\bsyscall\b|\bsysenter\b|\bint\s+\$?0x80\b|\bsvc\s+#?0\b",
     "makes system calls from inline assembly"),
    # A symbol bound under another name, in a string: `.symver local, pthread_create@GLIBC_2.2.5` (in any asm
    # template) or `_Pragma("redefine_extname ...")`.
    (r"\.symver\b|\b_Pragma\s*\(\s*\"\s*(?:weak|redefine_extname)\b", _RENAMES),
)
# torch / ATen functions a binding may call: allocation, options, the stream and device guard.
_ALLOWED_TORCH_CALLS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "from_blob", "TensorOptions", "Tensor", "Scalar", "Device", "dtype", "device", "IntArrayRef", "ArrayRef",
    "getCurrentCUDAStream", "getDefaultCUDAStream", "CUDAGuard", "OptionalCUDAGuard", "getCurrentCUDABlasHandle",
    "elementSize", "typeMetaToScalarType", "toString", "kFloat", "kHalf", "kBFloat16", "kInt", "kLong",
    "arange", "Half", "BFloat16", "complex", "Float8_e4m3fn", "Float8_e5m2", "ScalarType",  # element types: values, not ops
})
_TORCH_CALL = re.compile(r"\b(?:at|torch)::(?:\w+::)*(\w+)\s*[({]|\busing\s+(?:::)?(?:at|torch|c10)::(?:\w+::)*(\w+)\s*;")
# Tensor methods that compute; a binding may only ask a tensor for its properties and data.
_TENSOR_COMPUTE_METHOD = re.compile(
    r"\.\s*(add|sub|mul|div|matmul|mm|bmm|addmm|baddbmm|relu|gelu|silu|sigmoid|tanh|softmax|log_softmax|sum|mean|"
    r"var|std|norm|exp|log|pow|sqrt|rsqrt|abs|neg|clamp|clamp_min|clamp_max|maximum|minimum|where|index_select|"
    r"gather|scatter|scatter_add|masked_fill|conv\d?d|linear|layer_norm|batch_norm|cumsum|prod|argmax|argmin|topk|"
    r"sort|max|min|repeat|cat|stack|to)_?\s*\(")

def check_sources(snapshot: Path) -> list[str]:
    """Violations found in the candidate's own sources: model_new.py and kernels/."""
    violations: list[str] = []
    files = [snapshot / "model_new.py", *sorted((snapshot / "kernels").rglob("*"))] if (snapshot / "kernels").is_dir() else [snapshot / "model_new.py"]
    for path in files:
        if not path.is_file():
            continue
        rules = _PYTHON_RULES if path.suffix == ".py" else _NATIVE_RULES if path.suffix in (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp") else ()
        if not rules:
            continue
        raw = path.read_text(errors="replace")
        text = _code_only(raw, python=path.suffix == ".py")
        if rules is _NATIVE_RULES:
            text = re.sub(r"[ \t]*::[ \t]*", "::", text)  # `at :: cpu :: add` is at::cpu::add
        checks = [(pattern, why, text) for pattern, why in rules]
        if rules is _NATIVE_RULES:
            violations += _torch_calls(path.relative_to(snapshot), text)
            if re.search(r"\busing\s+namespace\s+(?:::)?std\b", text):
                checks.append((_BARE_THREADS, _THREADS + " (`thread` under `using namespace std` is std::thread)", text))
            with_strings = _code_only(raw, python=False, keep_strings=True)
            checks += [(pattern, why, with_strings) for pattern, why in _NATIVE_RAW_RULES]
            violations += _asm_violations(path.relative_to(snapshot), text)
        else:
            with_strings = _code_only(raw, python=True, keep_strings=True)
            checks += [(pattern, why, with_strings) for pattern, why in _PYTHON_RAW_RULES]
        for pattern, why, text in checks:
            for match in re.finditer(pattern, text, flags=re.MULTILINE):
                line = text.count("\n", 0, match.start()) + 1
                violations.append(f"{path.relative_to(snapshot)}:{line} {why}: `{match.group(0).strip()}`")
                break
    return violations + check_module(snapshot)


# Inline assembly, read from C++ with string literals blanked. What is refused, and why:
# * an asm label: a bare `asm("name")` / `__asm__("name")` / `__asm("name")` after a declarator
#   (`extern "C" int run_it(const char*) __asm__("PyRun_SimpleString");`, `int x asm("...")`), at
#   namespace scope or in a declaration inside a function: the declared function is the named
#   symbol, whatever the name in the code says, so every rule that reads names is past. The name
#   is in the string, so the construct is what is refused: asm in declarator position (after an
#   identifier, `)` of a declarator, `]`, ...). A label takes no qualifier and no operands, so an
#   asm with `volatile`/`inline`/`goto` or with `:` operands is never one.
# * a top-level asm block: asm in statement position outside any function body (file, namespace,
#   extern "C" or class scope), with or without qualifiers: assembly there defines symbols, aliases
#   and code no rule reads, and honest kernels never need it.
# * asm hidden in a macro in a form that could become either of those once expanded: a bare
#   `asm("...")` (no qualifier, no operands) or the keyword without its parenthesis
#   (`#define L(n) asm(n)`, `#define A __asm__`). Write `asm volatile(...)` in macros.
# * a C++ keyword redefined with #define (`#define while f`): the text no longer reads as code.
# What is not refused: inline asm statements inside function bodies, `asm volatile(...)`, extended
# asm with operands, and bare `asm("...")` in statement position (after `;`, `{`, `}`, a label,
# `else`, `do`, or the `)` of if/while/for/switch): PTX in __device__ code (`asm volatile("mov.u32
# %0, %%laneid;" : "=r"(r))`), compiler barriers (`asm volatile("" ::: "memory")`). Their templates
# are read too: system-call instructions by _NATIVE_RAW_RULES, `.symver` by the renaming rule, and
# whatever they call or execute by the module rules (module_rules.py), which also stand behind what
# this text reading cannot see (macros that hide braces or keywords).
_ASM = re.compile(r"\b(?:asm|__asm|__asm__)\b")
_ASM_QUALIFIERS = re.compile(r"(?:\s*\b(?:volatile|__volatile__|__volatile|inline|__inline|__inline__|goto)\b)*\s*")
_KEYWORD_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(?:if|while|for|switch|else|do|return|asm|__asm|__asm__|volatile|"
                            r"__volatile__|goto|namespace|extern|struct|class|union|enum|template|typedef)\b", re.MULTILINE)
_SCOPE_HEAD = re.compile(r"(?:template\s*<.*?>\s*)?(?:typedef\s+)?(?:(?:inline\s+)?namespace|class|struct|union|enum)\b|"
                         r"extern\s*$", re.DOTALL)
_ASM_LABEL = ("declares a function or variable under an assembler name (an asm label, `int f(...) __asm__(\"name\")`): "
              "it calls whatever symbol the string names (PyRun_SimpleString, pthread_create) under a harmless name")
_ASM_TOP_LEVEL = ("has a top-level asm block (assembly outside any function body defines symbols, aliases and code no "
                  "rule reads); inline asm belongs in function bodies")
_ASM_MACRO = ("hides asm in a macro in a form that becomes an asm label or a top-level block once expanded (a bare "
              "`asm(\"...\")`, or the keyword without its parentheses); in a macro write `asm volatile(...)`")


def _asm_violations(name: Path, text: str) -> list[str]:
    """Asm labels, top-level asm blocks, asm hidden in macros, keywords redefined (see above)."""
    found: dict[str, tuple[int, str]] = {}

    def refuse(why: str, pos: int, shown: str) -> None:
        found.setdefault(why, (text.count("\n", 0, pos) + 1, shown))

    for match in _KEYWORD_MACRO.finditer(text):
        refuse("redefines a C++ keyword with #define: the code no longer reads as it is written", match.start(),
               match.group(0).strip())
    directives = [(m.start(), m.end()) for m in re.finditer(r"^[ \t]*#[^\n]*", text, flags=re.MULTILINE)]
    code = list(text)
    for start, end in directives:  # braces and asm in directives are not code until a macro expands
        code[start:end] = " " * (end - start)
    code = "".join(code)
    for start, end in directives:
        if not re.match(r"[ \t]*#[ \t]*define\b", text[start:end]):
            continue  # `#include <asm/unistd.h>` names a folder
        for match in _ASM.finditer(text, start, end):
            operands = _asm_operands(text, match.end(), end)
            if operands is None or not operands[0]:
                refuse(_ASM_MACRO, match.start(), text[match.start():end].strip()[:60])
    body_at = _function_bodies(code)
    for match in _ASM.finditer(code):
        operands = _asm_operands(code, match.end(), len(code))
        if operands is None:
            refuse(_ASM_MACRO, match.start(), code[match.start():match.start() + 40].split("\n")[0])
            continue
        shown = code[match.start():operands[1]][:80]
        qualified_or_extended, _ = operands
        statement = _statement_position(code, match.start())
        if not statement and not qualified_or_extended:
            declaration = max(code.rfind(c, 0, match.start()) for c in ";{}") + 1
            refuse(_ASM_LABEL, match.start(), code[declaration:operands[1]].strip()[-80:])
        elif not body_at(match.start()):  # (a qualified asm after a macro that ends a declaration, too)
            refuse(_ASM_TOP_LEVEL, match.start(), shown)
    return [f"{name}:{line} {why}: `{' '.join(shown.split())}`" for why, (line, shown) in found.items()]


def _asm_operands(text: str, pos: int, stop: int) -> tuple[bool, int] | None:
    """After an asm keyword: (has a qualifier or `:` operands, the end of its parentheses), or None
    where no balanced parenthesis follows the qualifiers."""
    qualifiers = _ASM_QUALIFIERS.match(text, pos)
    pos = qualifiers.end()
    if pos >= stop or text[pos] != "(":
        return None
    depth = 0
    for i in range(pos, stop):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return bool(qualifiers.group(0).strip()) or ":" in text[pos:i], i + 1
    return None


def _statement_position(code: str, pos: int) -> bool:
    """Whether what starts at ``pos`` can only be a statement (not a declarator's asm label)."""
    i = pos - 1
    while i >= 0 and code[i].isspace():
        i -= 1
    if i < 0 or code[i] in ";{}:":
        return True
    if code[i] == ")":
        depth = 0
        while i >= 0:
            depth += {")": 1, "(": -1}.get(code[i], 0)
            if depth == 0:
                break
            i -= 1
        before = re.search(r"(\w+)\s*$", code[:max(i, 0)])
        return bool(before) and before.group(1) in ("if", "while", "for", "switch", "constexpr")
    word = re.search(r"(\w+)$", code[:i + 1])
    return bool(word) and word.group(1) in ("else", "do")


def _function_bodies(code: str):
    """A function of a position: whether it lies inside a function body (or a lambda's, or any brace
    that is not a namespace, linkage, class, union or enum scope), read from the braces."""
    marks: list[tuple[int, bool]] = [(0, False)]  # (position, in a body from here on)
    stack: list[bool] = []
    boundary = 0
    for match in re.finditer(r"[{};]", code):
        char = match.group(0)
        if char == "{":
            body = (stack and stack[-1]) or not _SCOPE_HEAD.match(code[boundary:match.start()].strip())
            stack.append(bool(body))
        elif char == "}" and stack:
            stack.pop()
        boundary = match.end()
        marks.append((match.end(), bool(stack) and stack[-1]))
    starts = [position for position, _ in marks]

    def body_at(pos: int) -> bool:
        return marks[bisect.bisect_right(starts, pos) - 1][1]
    return body_at


def _torch_calls(name: Path, text: str) -> list[str]:
    for match in _TORCH_CALL.finditer(text):
        if (match.group(1) or match.group(2)) not in _ALLOWED_TORCH_CALLS:
            line = text.count("\n", 0, match.start()) + 1
            return [f"{name}:{line} calls a torch operator (`{match.group(0).rstrip('({ ')}`): only allocation and "
                    "tensor properties are allowed in kernels; compute in your own kernels"]
    for match in _TENSOR_COMPUTE_METHOD.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        return [f"{name}:{line} calls a computing tensor method (`.{match.group(1)}(`): compute in your own kernels"]
    return []


def _code_only(text: str, *, python: bool, keep_strings: bool = False) -> str:
    """The source with comments and string literals blanked (line numbers kept): rules apply to code.
    ``keep_strings`` blanks the comments alone."""
    if python:
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            return text  # unparsable: judge the raw text (the build has already rejected it)
        lines = text.splitlines(keepends=True)
        blanked = [list(line) for line in lines]
        for token in tokens:
            strings = (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1))
            if token.type == tokenize.COMMENT or (token.type in strings and not keep_strings):
                (row, col), (end_row, end_col) = token.start, token.end
                for r in range(row, end_row + 1):
                    start = col if r == row else 0
                    stop = end_col if r == end_row else len(blanked[r - 1])
                    for c in range(start, min(stop, len(blanked[r - 1]))):
                        if blanked[r - 1][c] != "\n":
                            blanked[r - 1][c] = " "
        return "".join("".join(line) for line in blanked)

    def blank(match: re.Match) -> str:
        if keep_strings and not match.group(0).startswith("/"):
            return match.group(0)
        return re.sub(r"[^\n]", " ", match.group(0))

    # As the compiler reads it: line splices joined first (`std::thr\<newline>ead` is std::thread, a
    # `//` comment ending in a backslash goes on), then comments, raw strings, strings and character
    # literals (not a digit separator: 1'000), each whole, so no quote inside one starts another.
    return re.sub(r'//[^\n]*|/\*.*?\*/|R"([^()\\\s]{0,16})\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|(?<!\w)\'(?:\\.|[^\'\\\n]){1,10}\'',
                  blank, _spliced(text), flags=re.DOTALL)


def _spliced(text: str) -> str:
    """C++'s line splices (a backslash at a line's end) joined; the joined line's newlines follow it,
    so every other line keeps its number."""
    out, joined, carried = [], "", 0
    for line in text.split("\n"):
        if line.endswith("\\"):
            joined, carried = joined + line[:-1], carried + 1
            continue
        out.append(joined + line + "\n" * carried)
        joined, carried = "", 0
    if carried:
        out.append(joined + "\n" * (carried - 1))
    return "\n".join(out)
