"""Rules on the built module: what build/cuda_extension*.so asks the dynamic linker for, and what
its own machine code does (trusted side: the module is read as data, never loaded).

- ``check_module``: the violations of a snapshot's built module(s); run by ``static_rules``.
- ``undefined_symbols``: a module's imports, read from its ELF file by the standard library alone.
- ``read_untrusted``: a file the sandboxed side wrote, read trusting nothing about it.

Why the module and not only its sources: C++ can call a function without spelling its name where
the source rules look (an asm label, ``.symver``, a name in an inline asm template, a module built
from other sources), but whatever the spelling, a function of another library is one the module
imports by its real name, and a system call the module makes itself is an instruction in its code.
What is read, and the limits (docs/design.md, Rules and Known limits): these are a second line
behind the source rules, not a wall. Honest modules need none of what is refused; the comment above
``_REFUSED_IMPORTS`` says how the list was derived, and a change to it must keep honest builds
passing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)

#: The broker copies at most 256 MB per snapshot; a module larger than this is not read.
MAX_MODULE_BYTES = 512 << 20
#: Violations reported per module at most (the rest summed up in the last one).
MAX_VIOLATIONS = 10
OBJDUMP_TIMEOUT_S = 120

_RUNS_PYTHON = "runs or compiles Python code from C++, past every rule on model_new.py"
_INTERPRETER = ("reaches the Python interpreter's internals (frames, globals, modules, sys, its threads): "
                "a binding only defines functions")
_HOOKS = "hooks into the interpreter (tracing, profiling, watchers, pending calls, garbage collector)"
_THREADS = ("starts threads or processes: work that runs on after forward returns is out of the timing's sight "
            "(parallelise with OpenMP: `#pragma omp parallel for`)")
_LATER = "arranges for code to run later, outside the call (signal handlers, timers)"
_LOADS = "loads code or looks functions up at run time (a function found by name is one no rule reads)"
_SYSCALL = "makes raw system calls"
_MEMORY = "maps memory or changes its protection (machine code written at run time passes every check on the module)"

# What a module may not import: (exact-name regex, why). Matched against the whole symbol name,
# without its version (`pthread_create@GLIBC_2.34` is pthread_create).
#
# How the list was derived: it is a denylist, so that everything pybind11, torch's headers, libstdc++
# and OpenMP bring into an honest module passes. `nm -D --undefined-only` of the honest builds made
# with the workspace's own utils/build.py -- examples/relu_add/solutions/cpp (g++ 12, torch 2.13,
# -fopenmp), examples/relu_add/solutions/cuda (nvcc 13.0, torch 2.11, on an H200 host) and the
# tests/candidates/cpp fixtures' honest code (relu_add.cpp + misc_fixture.h) -- lists these CPython
# symbols in the families below, all from pybind11 and binding.cpp: PyEval_AcquireThread,
# PyEval_SaveThread, PyEval_GetBuiltins (pybind11's internals live in the builtins dict),
# PyFrame_GetBack, PyFrame_GetCode, PyFrame_GetLineNumber (pybind11 formats a Python traceback into
# error messages), PyGILState_Check/Ensure/GetThisThreadState/Release, PyInterpreterState_Get,
# PyInterpreterState_GetDict, PyInterpreterState_Main, PyThreadState_New/Clear/DeleteCurrent,
# PyThreadState_Get (pybind11 of torch 2.11 only), _PyThreadState_UncheckedGet, PyThread_tss_*,
# Py_GetVersion; and no pthread_* but pthread_mutex_lock/unlock, no thread, process, loader or
# syscall symbol at all (OpenMP's threads are libgomp's own: its pthread_create is not in the
# module; GOMP_* and omp_* stay allowed). So whole families are refused only where honest modules
# use none of them (PyRun_*, PyImport_*, PySys_*, PyCode_*, ...), and elsewhere only the members
# that reach frames, threads or hooks. PyThreadState_* and PyGILState_* are what pybind11's GIL
# handling uses: only PyThreadState_GetFrame/SetAsyncExc/Next are refused of them. A binding taking
# std::vector<torch::Tensor>, std::optional<torch::Tensor>, std::vector<int64_t>, double, bool,
# std::string, at::ScalarType and returning a std::tuple, with py::gil_scoped_release, added only
# PyEval_RestoreThread and object/sequence/number calls: nothing refused. std::map / std::set
# arguments and py::print add PyImport_ImportModule (refused, see its message).
#
# libstdc++ reaches `syscall` itself for C++20 atomic waits (std::jthread's stop token, std::latch,
# std::barrier, std::counting_semaphore, atomic::wait): those are refused with it (no honest kernel
# here used them; the skills' threads are OpenMP's).
_REFUSED_IMPORTS: tuple[tuple[str, str], ...] = (
    (r"_?PyRun_\w+|_?Py_CompileString\w*|Py_CompileStringObject|_?PyEval_EvalCode\w*|_?PyEval_EvalFrame\w*|"
     r"_?PyCode_\w+|PyFunction_New\w*|_?PyMarshal_\w+|_?PyAST_\w+|_?PyParser_\w+|PyUnstable_Code\w*|"
     r"Py_Main|Py_BytesMain|Py_RunMain|Py_Initialize\w*|Py_InitializeFromConfig|Py_Finalize\w*|"
     r"Py_NewInterpreter\w*|Py_EndInterpreter|Py_Exit|PyUnstable_Exec\w*",
     _RUNS_PYTHON),
    # pybind11 itself imports modules for std::map / std::set arguments (collections.abc) and py::print (sys):
    # the one honest use seen, and rare in kernels, so the message says what to take instead.
    (r"_?PyImport_\w+",
     "imports Python modules from C++ (sys and the harness's own modules are one import away); pybind11 does "
     "this for std::map/std::set arguments and py::print: a binding takes tensors, numbers, strings, lists, "
     "tuples and optionals"),
    (r"_?PySys_\w+|_?PyEval_GetFrame\w*|_?PyEval_GetGlobals|_?PyEval_GetLocals|"
     r"PyFrame_(?!GetBack$|GetCode$|GetLineNumber$)\w+|_PyFrame_\w+|PyUnstable_(?:Interpreter)?Frame\w*|"
     r"_?PyThreadState_GetFrame|PyThreadState_SetAsyncExc|_?PyThreadState_Next|"
     r"PyInterpreterState_(?:Head|Next|ThreadHead)|_PyThread_CurrentFrames|_PyThread_CurrentExceptions|"
     r"PyFunction_Get\w+|PyThread_start_new_thread|PyThread_start_joinable_thread|"
     r"PyOS_(?:BeforeFork|AfterFork\w*|setsig)",
     _INTERPRETER),
    (r"_?PyEval_SetProfile\w*|_?PyEval_SetTrace\w*|Py\w*_AddWatcher|Py\w*_ClearWatcher|PyDict_Watch|PyType_Watch|"
     r"PyRefTracer_\w+|_?Py_AddPendingCall|_?PyGC_\w+|PyUnstable_GC_\w+|Py_AtExit|PyFile_SetOpenCodeHook",
     _HOOKS),
    (r"pthread_create|__pthread_create_2_\d|thrd_create|_?_?clone|clone3|__clone_internal|_?_?fork|_Fork|__libc_fork|"
     r"_?_?vfork|execve|execveat|fexecve|execvp?e?|execlp?e?|posix_spawnp?|posix_spawn_\w+|_?_?libc_system|system|"
     r"_?_?popen|_IO_popen|timer_create|mq_notify|aio_\w+|lio_listio\w*|getaddrinfo_a|"
     r"_ZNSt6thread15_M_start_thread\w*",
     _THREADS),
    (r"signal|__sysv_signal|sysv_signal|bsd_signal|sigset|_?_?sigaction|setitimer|alarm|ualarm|timer_settime",
     _LATER),
    (r"dlopen|dlmopen|dlsym|dlvsym|__libc_dlopen_mode|__libc_dlsym|__libc_dlvsym|dl_iterate_phdr|dladdr1?|dlinfo|"
     r"_dl_(?!find_object$)\w+",
     _LOADS),
    (r"syscall|__syscall\w*", _SYSCALL),
    (r"mprotect|pkey_mprotect|mmap|mmap64|mremap|memfd_create", _MEMORY),
)
_REFUSED = [(re.compile(pattern), why) for pattern, why in _REFUSED_IMPORTS]
#: Names shown to a reader instead of the mangled one.
_DISPLAY = {"_ZNSt6thread15_M_start_thread": "std::thread::_M_start_thread [std::thread, std::jthread, std::async]"}

# Instructions that enter the kernel, by the ELF's machine: x86-64 / i386 and AArch64.
_SYSCALL_INSTRUCTIONS = {
    62: re.compile(r"\b(?:syscall|sysenter|int\s+\$0x80)\b"),
    3: re.compile(r"\b(?:syscall|sysenter|int\s+\$0x80)\b"),
    183: re.compile(r"^\s*svc\b"),
}


_NOT_DISASSEMBLED = "the harness could not disassemble the module"
_CACHE: OrderedDict[str, tuple[str, ...]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


class _Unreadable(Exception):
    """The module is not an ELF shared object this reader can follow."""


def check_module(snapshot: Path) -> list[str]:
    """The rules applied to a snapshot's built module(s).

    Args:
        snapshot: the broker's copy of a workspace; its build/cuda_extension*.so are read.

    Returns:
        One message per violation, each starting with the module's path in the snapshot (a module
        that cannot be read is one); [] where there is no module or nothing is wrong."""
    build = snapshot / "build"
    if not build.is_dir():
        return []
    violations: list[str] = []
    for path in sorted(build.glob("cuda_extension*.so")):
        name = f"build/{path.name}"
        try:
            data = read_untrusted(path)
        except (OSError, ValueError) as exc:
            violations.append(f"{name}: the harness cannot read the module ({exc}); build it with utils/compile.sh")
            continue
        violations += [f"{name}: {v}" for v in _module_violations(data)]
    return violations


def undefined_symbols(data: bytes) -> set[str]:
    """The module's undefined dynamic symbols, without versions: those of `.dynsym` (what
    `nm -D --undefined-only` lists) and those the dynamic relocations bind (found through the
    dynamic segment, so section headers that lie hide nothing).

    Args:
        data: the module's bytes.

    Returns:
        The symbols' names (``pthread_create``, not ``pthread_create@GLIBC_2.34``).

    Raises:
        _Unreadable: not an ELF shared object this reader can follow."""
    return _Elf(data).undefined_symbols()


def _module_violations(data: bytes) -> tuple[str, ...]:
    """What is wrong with one module, by its bytes (remembered by their hash: a workspace's module is
    judged again at every verification until it changes)."""
    digest = hashlib.sha256(data).hexdigest()
    with _CACHE_LOCK:
        if digest in _CACHE:
            _CACHE.move_to_end(digest)
            return _CACHE[digest]
    found = _judge(data)
    if any(v.startswith(_NOT_DISASSEMBLED) for v in found):
        return found  # perhaps a busy host: judged again next time
    with _CACHE_LOCK:
        _CACHE[digest] = found
        while len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return found


def _judge(data: bytes) -> tuple[str, ...]:
    try:
        elf = _Elf(data)
        imports = elf.undefined_symbols()
    except _Unreadable as exc:
        return (f"the harness cannot read the module as an ELF shared object ({exc}); build it with utils/compile.sh",)
    found = []
    for symbol in sorted(imports):
        why = next((why for pattern, why in _REFUSED if pattern.fullmatch(symbol)), None)
        if why:
            shown = next((text for prefix, text in _DISPLAY.items() if symbol.startswith(prefix)), symbol)
            found.append(f"the module imports {shown} ({why})")
    found += elf.code_outside_sections()
    found += _syscall_instructions(elf, data)
    if len(found) > MAX_VIOLATIONS:
        found = found[:MAX_VIOLATIONS - 1] + [f"... and {len(found) - MAX_VIOLATIONS + 1} more of the above kinds"]
    return tuple(found)


def read_untrusted(path: Path, limit: int = MAX_MODULE_BYTES) -> bytes:
    """The bytes of a file the sandboxed side wrote, trusting nothing about it.

    Args:
        path: the file; a link is not followed.
        limit: the most bytes it may hold.

    Returns:
        Its bytes.

    Raises:
        ValueError: not a regular file (a fifo, a device), or more than ``limit`` bytes.
        OSError: it cannot be opened (a link among them)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes is more than this file may take")
        data = handle.read(limit + 1)
        if len(data) > limit:
            raise ValueError("the file grew past what it may take while it was read")
        return data


# ------------------------------------------------------------------------------------ machine code

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


def _syscall_instructions(elf: _Elf, data: bytes) -> list[str]:
    """System-call instructions in the module's code sections (objdump -d), one violation per function."""
    pattern = _SYSCALL_INSTRUCTIONS.get(elf.machine)
    if pattern is None:
        _warn_once(f"module rules: no system-call check for ELF machine {elf.machine}; modules' machine code is not read "
                   "(their imports still are)")
        return []
    objdump = shutil.which("objdump")
    if objdump is None:
        _warn_once("module rules: objdump (binutils) is not installed here; modules' machine code is not read "
                   "(their imports still are)")
        return []
    with tempfile.NamedTemporaryFile(prefix="module-rules-", suffix=".so") as copy:
        copy.write(data)  # objdump reads exactly the bytes judged here
        copy.flush()
        try:
            proc = subprocess.run([objdump, "-d", "-C", "-w", "--no-show-raw-insn", copy.name], check=False,
                                  capture_output=True, text=True, errors="replace", timeout=OBJDUMP_TIMEOUT_S,
                                  env={"LC_ALL": "C", "PATH": os.defpath})
        except subprocess.TimeoutExpired:
            return [f"{_NOT_DISASSEMBLED} in {OBJDUMP_TIMEOUT_S} s (objdump)"]
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no message"])[0].replace(copy.name, "the module")
        return [f"{_NOT_DISASSEMBLED} (objdump: {first[:200]})"]
    found: dict[str, str] = {}
    function = "?"
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace():
            header = re.match(r"[0-9a-f]+ <(.*)>:$", line)
            if header:
                function = header.group(1)
            continue
        # The instruction, without objdump's notes (`<syscall@plt>` names a call's target, `#` an address).
        instruction = re.sub(r"<[^>]*>|#.*", "", line.split("\t", 1)[1] if "\t" in line else "").strip()
        if instruction and pattern.search(instruction) and function not in found:
            found[function] = instruction
    return [f"the module's own machine code enters the kernel (`{insn}` in {fn[:160]}): a raw system call reaches "
            "the process, its threads and files past every rule on what the module imports" for fn, insn in found.items()]


# ------------------------------------------------------------------------------------ ELF reading

_PT_LOAD, _PT_DYNAMIC, _PF_X = 1, 2, 1
_SHT_NOBITS, _SHT_DYNSYM, _SHF_ALLOC, _SHF_EXECINSTR = 8, 11, 2, 4
_DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT = 5, 6, 10, 11
# (address tag, size tag, entry-size tag or None, has addend)
_DT_RELOCATIONS = ((7, 8, 9, True), (17, 18, 19, False), (23, 2, None, None))  # RELA, REL, JMPREL (DT_PLTREL says)
_DT_PLTREL, _DT_RELA = 20, 7


class _Elf:
    """Just enough of an ELF file (32/64-bit, either byte order) to list its imports and code ranges."""

    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or len(data) < 52:
            raise _Unreadable("no ELF header")
        if data[4] not in (1, 2) or data[5] not in (1, 2):
            raise _Unreadable("unknown ELF class or byte order")
        self.data, self.is64 = data, data[4] == 2
        self.end = "<" if data[5] == 1 else ">"
        word = "Q" if self.is64 else "I"
        try:
            (e_type, self.machine, _, _, e_phoff, e_shoff, _, _, e_phentsize, e_phnum, e_shentsize, e_shnum,
             _) = self._unpack(f"HHI{word}{word}{word}IHHHHHH", 16)
        except struct.error as exc:
            raise _Unreadable(f"truncated ELF header ({exc})") from None
        if e_type != 3:
            raise _Unreadable("not a shared object (ELF type ET_DYN)")
        phdr = "IIQQQQQQ" if self.is64 else "IIIIIIII"
        shdr = "IIQQQQIIQQ" if self.is64 else "IIIIIIIIII"
        if e_phnum and e_phentsize < struct.calcsize(self.end + phdr) or e_shnum and e_shentsize < struct.calcsize(self.end + shdr):
            raise _Unreadable("ELF header entries too small")
        self.segments = []  # (type, flags, offset, vaddr, filesz)
        for i in range(e_phnum):
            fields = self._unpack(phdr, e_phoff + i * e_phentsize)
            if self.is64:
                p_type, p_flags, p_offset, p_vaddr, _, p_filesz, _, _ = fields
            else:
                p_type, p_offset, p_vaddr, _, p_filesz, _, p_flags, _ = fields
            self.segments.append((p_type, p_flags, p_offset, p_vaddr, p_filesz))
        self.sections = []  # (type, flags, offset, size, link, entsize)
        for i in range(e_shnum if e_shoff else 0):
            _, sh_type, sh_flags, _, sh_offset, sh_size, sh_link, _, _, sh_entsize = self._unpack(shdr, e_shoff + i * e_shentsize)
            self.sections.append((sh_type, sh_flags, sh_offset, sh_size, sh_link, sh_entsize))

    def _unpack(self, fmt: str, offset: int) -> tuple:
        if offset < 0:
            raise _Unreadable("negative offset")
        try:
            return struct.unpack_from(self.end + fmt, self.data, offset)
        except struct.error:
            raise _Unreadable(f"a table runs past the end of the file (offset {offset:#x})") from None

    def _string(self, table: int, size: int, index: int) -> str:
        if index >= size or table + index >= len(self.data):
            raise _Unreadable("a symbol name lies outside its string table")
        stop = self.data.find(b"\0", table + index, table + size)
        if stop < 0:
            raise _Unreadable("an unterminated symbol name")
        return self.data[table + index:stop].decode("latin-1")

    def _symbol(self, symtab: int, entsize: int, strtab: int, strsz: int, index: int) -> str | None:
        """The name of symbol ``index`` if it is undefined (section index 0), else None."""
        if self.is64:
            st_name, _, _, st_shndx, _, _ = self._unpack("IBBHQQ", symtab + index * entsize)
        else:
            st_name, _, _, _, _, st_shndx = self._unpack("IIIBBH", symtab + index * entsize)
        return self._string(strtab, strsz, st_name) if st_shndx == 0 and st_name else None

    def _offset(self, vaddr: int) -> int:
        for p_type, _, p_offset, p_vaddr, p_filesz in self.segments:
            if p_type == _PT_LOAD and p_vaddr <= vaddr < p_vaddr + p_filesz:
                return p_offset + vaddr - p_vaddr
        raise _Unreadable(f"address {vaddr:#x} is in no loaded segment")

    def undefined_symbols(self) -> set[str]:
        names: set[str] = set()
        sym_size = 24 if self.is64 else 16
        for sh_type, _, sh_offset, sh_size, sh_link, sh_entsize in self.sections:
            if sh_type != _SHT_DYNSYM:
                continue
            if sh_link >= len(self.sections) or sh_entsize < sym_size:
                raise _Unreadable("a .dynsym section without its string table")
            _, _, str_offset, str_size, _, _ = self.sections[sh_link]
            for index in range(1, sh_size // sh_entsize):
                name = self._symbol(sh_offset, sh_entsize, str_offset, str_size, index)
                if name:
                    names.add(name)
        dynamic = [s for s in self.segments if s[0] == _PT_DYNAMIC]
        if not dynamic:
            raise _Unreadable("no dynamic segment")
        tags: dict[int, int] = {}
        entry = "qQ" if self.is64 else "iI"
        step = struct.calcsize(self.end + entry)
        for _, _, offset, _, filesz in dynamic:
            for position in range(offset, offset + filesz - step + 1, step):
                tag, value = self._unpack(entry, position)
                if tag == 0:
                    break
                tags.setdefault(tag, value)
        if _DT_SYMTAB not in tags or _DT_STRTAB not in tags:
            return names  # binds no symbol
        symtab, strtab = self._offset(tags[_DT_SYMTAB]), self._offset(tags[_DT_STRTAB])
        strsz, syment = tags.get(_DT_STRSZ, 0), tags.get(_DT_SYMENT, sym_size)
        if syment < sym_size:
            raise _Unreadable("dynamic symbols too small")
        for address_tag, size_tag, entsize_tag, has_addend in _DT_RELOCATIONS:
            if address_tag not in tags or not tags.get(size_tag):
                continue
            if has_addend is None:  # DT_JMPREL: RELA or REL as DT_PLTREL says
                has_addend = tags.get(_DT_PLTREL, _DT_RELA) == _DT_RELA
            default = (24 if has_addend else 16) if self.is64 else (12 if has_addend else 8)
            entsize = tags.get(entsize_tag, default) if entsize_tag else default
            if entsize < default:
                raise _Unreadable("relocation entries too small")
            start = self._offset(tags[address_tag])
            if start + tags[size_tag] > len(self.data):
                raise _Unreadable("relocations run past the end of the file")
            for position in range(start, start + tags[size_tag] - entsize + 1, entsize):
                (info,) = self._unpack("Q" if self.is64 else "I", position + (8 if self.is64 else 4))
                index = info >> 32 if self.is64 else info >> 8
                if index:
                    name = self._symbol(symtab, syment, strtab, strsz, index)
                    if name:
                        names.add(name)
        return names

    def code_outside_sections(self) -> list[str]:
        """Executable bytes that objdump -d would not read: parts of an executable segment that lie in
        no section at all and are not zero padding. (Linkers without -z separate-code map read-only
        data sections into the executable segment too; those bytes are data to the linker and are
        not disassembled: a limit of this check, on such toolchains only.)"""
        covered = sorted((off, off + size) for sh_type, flags, off, size, _, _ in self.sections
                         if sh_type != _SHT_NOBITS and (flags & _SHF_ALLOC or flags & _SHF_EXECINSTR))
        for p_type, p_flags, p_offset, _, p_filesz in self.segments:
            if p_type != _PT_LOAD or not p_flags & _PF_X:
                continue
            position, stop = p_offset, min(p_offset + p_filesz, len(self.data))
            for start, end in covered + [(stop, stop)]:
                if end <= position:
                    continue
                gap = self.data[position:min(start, stop)] if start > position else b""
                if gap.strip(b"\0"):
                    first = position + len(gap) - len(gap.lstrip(b"\0"))
                    return [(f"the module has executable bytes in no section (file offset {first:#x}): machine code "
                             "there is out of the harness's reading (build with utils/compile.sh)")]
                position = max(position, end)
                if position >= stop:
                    break
        return []
