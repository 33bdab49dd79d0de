"""utils/build.py — builds this workspace's kernels (PROTECTED: read-only, hash-checked).

Why one long file: it is copied into every workspace and protected by its hash, and it runs
inside the sandbox with only the standard library and torch: one self-contained file is what
the sandbox can hash-check and run, and what an agent can read.

Run it as ``bash utils/compile.sh`` (CUDA: ``TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh``).
``bash utils/compile.sh kernels/foo.cu`` compiles just the named sources, without linking
(a quick "does this file compile?").

What it does, by workspace kind (read from SKILL.md's ``name:``; without one, from the files):

* cuda / cpp — writes ``build/build.ninja`` and runs ninja: one object per source
  (``binding.cpp`` and every ``kernels/*.cpp`` with g++, every ``kernels/*.cu`` with nvcc),
  linked into ``build/cuda_extension<EXT_SUFFIX>``, importable as ``cuda_extension`` with
  ``build/`` on ``sys.path``. Ninja rebuilds only what changed (header edits are tracked
  through compiler depfiles) and relinks. A freshly linked module is loaded (dlopen,
  RTLD_NOW) in a child process, which catches undefined symbols here rather than on the GPU
  worker (skipped, ~1 s, when it needs no symbol that the last module that loaded did not:
  an edit inside a kernel); duplicate REGISTER_BINDING names are caught from the sources. A failed build
  removes the module (and build/build_info.json), so no stale build can be verified or
  profiled by mistake. A good one writes build/build_info.json: the sha256 of every source
  it was built from, so a later edit that was never built can be detected.
  ``model_new.py`` is syntax-checked first: its errors are shown before the build, and a
  module that built then still ends in BUILD FAILED (ModelNew could not be imported).
* triton — nothing to build: Triton kernels compile when they first launch. Byte-compiles
  ``model_new.py`` and ``kernels/*.py`` (into a temp dir) to catch syntax errors.

Output is short and meant for a model to read: one line per compiled source, the
compiler's first errors with file:line (trimmed), and a final ``BUILD OK: ...`` /
``BUILD FAILED: ...`` line; the exit status is 0 only on success.

Flags: g++ ``-O3 -std=c++<torch's> -fPIC``, torch's include paths, ``-D_GLIBCXX_USE_CXX11_ABI``
from torch, ``-DTORCH_EXTENSION_NAME=cuda_extension -DTORCH_API_INCLUDE_EXTENSION_H``; cpp
workspaces add ``-fopenmp`` (the same libgomp torch uses). nvcc ``-O3 -lineinfo
--expt-relaxed-constexpr --extended-lambda`` and ``-gencode`` for each arch of
``TORCH_CUDA_ARCH_LIST`` (else ``KERNEL_ENV_CUDA_ARCH``, else 9.0: the sandbox has no GPU to
ask). Links ``-lc10 -ltorch_cpu -ltorch -ltorch_python`` (+ ``-lc10_cuda -ltorch_cuda
-lcudart``, and cuBLAS/cuDNN when they are installed, only if used), rpath to their dirs.
torch-derived settings are cached in ``build/.toolchain.json`` (importing torch costs ~2 s),
keyed on the Python, the torch install and this file.

Precompiled torch headers: with ``$KE_HEADERS`` (a read-only folder the trusted host fills,
see ``precompiled_header``), sources that start with a torch header are compiled with
``-include`` of the header precompiled for this compiler and these flags: about half of a
binding source's compile time. The same folder holds binding.cpp's object (a fixed, protected
file: linked as it is, never compiled in a workspace) and the toolchain's torch settings (a
first build need not import torch to find them). ``--precompile DIR`` (the host's job, never a
sandbox's) makes them.

It must never: write outside ``build/`` and a temp dir (utils/ is read-only: no
__pycache__), use the network, use ccache, import or run ``model_new.py``, or leave an
old module in place after a failed build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the workspace
BUILD = Path("build")  # relative to ROOT (we chdir there), so compiler messages say kernels/x.cu:12
MODULE = "cuda_extension"
TOOLCHAIN_CACHE = BUILD / ".toolchain.json"
NINJA_STATUS = "@@ninja "  # marks ninja's status lines in its output
MAX_ERRORS_PER_FILE = 5
MAX_ERRORS = 12
CONTEXT_LINES = 5
MAX_WARNINGS = 6
MAX_LINE = 400
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
HEADERS_ENV = "KE_HEADERS"  # the read-only folder of precompiled torch headers (see precompiled_header)
PCH_NAME = "torch_headers.h"
PCH_TEXT = "#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"
PCH_VARIABLE = "pch"
TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](?:torch/|ATen/|c10/|pybind11/|(?:\.\./)?binding_registry\.h\")")
DEFAULT_ARCH = "9.0"
NAMED_ARCHES = {"volta": "7.0", "turing": "7.5", "ampere": "8.0;8.6", "ada": "8.9", "hopper": "9.0", "blackwell": "10.0"}


class BuildError(Exception):
    """A problem that ends the build; the message is the one line the agent reads."""


# --------------------------------------------------------------------------- helpers


def say(line: str = "") -> None:
    print(line, flush=True)


def clip(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 5] + " ...)"


def workspace_kind() -> str:
    """'cuda', 'cpp' or 'triton': SKILL.md's front-matter name, else guessed from the files."""
    skill = Path("SKILL.md")
    if skill.is_file():
        text = skill.read_text(errors="replace")
        if text.startswith("---"):
            front = text.split("---", 2)[1] if text.count("---") >= 2 else ""
            match = re.search(r"^name:\s*['\"]?([\w-]+)", front, re.M)
            if match and match.group(1) in ("cuda", "cpp", "triton"):
                return match.group(1)
    if not Path("binding.cpp").is_file():
        return "triton"
    if any(Path("kernels").glob("*.cu")) or any(Path("kernels").glob("*.cuh")):
        return "cuda"
    return "cpp"


# --------------------------------------------------------------------------- triton


def check_python_sources() -> int:
    say("Triton workspace: nothing to compile ahead of time; Triton kernels are JIT-compiled at")
    say("their first launch (in utils.verification / utils.profiling, on the GPU worker).")
    say("Checking Python syntax of model_new.py and kernels/*.py ...")
    files = [p for p in [Path("model_new.py"), *sorted(Path("kernels").glob("*.py"))] if p.is_file()]
    if not Path("model_new.py").is_file():
        say("BUILD FAILED: model_new.py is missing (it must define ModelNew)")
        return 1
    errors = syntax_errors(files)
    for err in errors:
        say(err)
    if errors:
        say(f"BUILD FAILED: {len(errors)} file(s) with syntax errors")
        return 1
    if not re.search(r"^class\s+ModelNew\b", Path("model_new.py").read_text(errors="replace"), re.M):
        say("BUILD FAILED: model_new.py does not define class ModelNew")
        return 1
    say(f"CHECK OK: {', '.join(str(f) for f in files)} (syntax only; run python3 -m utils.verification to test)")
    return 0


def syntax_errors(files: list[Path]) -> list[str]:
    """Byte-compile into a temp dir (never __pycache__ in the workspace); one message per bad file."""
    errors = []
    with tempfile.TemporaryDirectory(prefix="kernel_env_pycheck_") as tmp:
        for i, path in enumerate(files):
            try:
                py_compile.compile(str(path), cfile=os.path.join(tmp, f"{i}.pyc"), doraise=True)
            except py_compile.PyCompileError as exc:
                inner = exc.exc_value
                if isinstance(inner, SyntaxError):
                    where = f"{path}:{inner.lineno}" + (f":{inner.offset}" if inner.offset else "")
                    text = (inner.text or "").rstrip("\n")
                    errors.append(f"{where}: error: {inner.msg}" + (f"\n    {text.strip()}" if text.strip() else ""))
                else:
                    errors.append(f"{path}: error: {exc.msg.strip().splitlines()[-1]}")
    return errors


# --------------------------------------------------------------------------- toolchain


def toolchain_key() -> str:
    """Identifies the Python + torch install + this script without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise BuildError(f"{sys.executable} cannot find torch; the build needs the Python that has torch installed")
    torch_dir = Path(spec.origin).parent
    version_file = torch_dir / "version.py"
    stat = version_file.stat() if version_file.exists() else None
    parts = [os.path.realpath(sys.executable), sys.version, str(torch_dir), str(stat and (stat.st_mtime_ns, stat.st_size)),
             hashlib.sha256(Path(__file__).read_bytes()).hexdigest()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def torch_settings() -> dict:
    """Include/lib dirs, C++ ABI and standard from torch; cached in build/.toolchain.json, and
    read from the host's precompiled folder (``$KE_HEADERS/toolchain-<key>.json``, made by
    ``--precompile`` with this same script and Python) before importing torch to find them."""
    key = toolchain_key()
    host = Path(os.environ[HEADERS_ENV]) / f"toolchain-{key}.json" if os.environ.get(HEADERS_ENV) else None
    for cache in (TOOLCHAIN_CACHE, host):
        try:
            cached = json.loads(cache.read_text()) if cache else None
        except (OSError, ValueError):
            continue
        if isinstance(cached, dict) and cached.get("key") == key:
            if cache is host:
                BUILD.mkdir(exist_ok=True)
                TOOLCHAIN_CACHE.write_text(json.dumps(cached, indent=1))
            return cached
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # its CUDA_HOME guess is ours to make
    try:
        import torch
        import torch.utils.cpp_extension as cpp_extension
    except Exception as exc:  # noqa: BLE001 - any import failure is one line for the agent
        raise BuildError(f"{sys.executable} cannot import torch: {type(exc).__name__}: {exc}") from None
    source = Path(cpp_extension.__file__).read_text(errors="replace")
    settings = {
        "key": key,
        "torch_version": torch.__version__,
        "torch_dir": str(Path(torch.__file__).parent),
        "include_dirs": cpp_extension.include_paths("cpu"),
        "lib_dirs": cpp_extension.library_paths("cpu"),
        "python_include": sysconfig.get_path("include", scheme="posix_prefix"),
        "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "cxx_std": "c++20" if "-std=c++20" in source else "c++17",
    }
    BUILD.mkdir(exist_ok=True)
    TOOLCHAIN_CACHE.write_text(json.dumps(settings, indent=1))
    return settings


def find_tool(name: str, extra: list[str] = ()) -> str | None:
    """An executable by name, skipping ccache wrappers (ccache must stay out of the build)."""
    candidates = list(extra)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if directory and "ccache" not in directory:
            candidates.append(os.path.join(directory, name))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            if os.path.basename(os.path.realpath(path)) != "ccache":
                return os.path.abspath(path)
    return None


def find_cuda() -> tuple[str, str]:
    """(nvcc, CUDA home): CUDA_HOME/CUDA_PATH, then nvcc on PATH, then /usr/local/cuda."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    on_path = find_tool("nvcc")
    if on_path:
        homes.append(str(Path(on_path).parent.parent))
    homes.append("/usr/local/cuda")
    nvcc = next((str(Path(h) / "bin" / "nvcc") for h in homes if h and (Path(h) / "bin" / "nvcc").is_file()), None)
    nvcc = nvcc or on_path
    if not nvcc:
        raise BuildError("no nvcc found (looked at CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda); kernels/*.cu cannot be compiled here")
    home = next((h for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").is_file()), None)
    if home is None:
        # nvcc may be a wrapper script (/usr/local/bin/nvcc): ask nvcc where its toolkit is.
        try:
            out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True, timeout=30).stderr
            match = re.search(r"^#\$ TOP=(.+)$", out, re.M)
            if match and (Path(match.group(1).strip()) / "include" / "cuda_runtime.h").is_file():
                home = match.group(1).strip()
        except (OSError, subprocess.SubprocessError):
            pass
    if home is None:
        raise BuildError(f"found {nvcc} but no CUDA toolkit headers (include/cuda_runtime.h); set CUDA_HOME")
    return nvcc, str(Path(home).resolve())


def cuda_arch_flags() -> list[str]:
    """-gencode flags from TORCH_CUDA_ARCH_LIST ('9.0', '9.0a', '8.0;9.0+PTX', 'Hopper'), else KERNEL_ENV_CUDA_ARCH, else 9.0."""
    spec = os.environ.get("TORCH_CUDA_ARCH_LIST") or os.environ.get("KERNEL_ENV_CUDA_ARCH") or DEFAULT_ARCH
    entries = []
    for item in re.split(r"[;,\s]+", spec.strip()):
        if item:
            entries += NAMED_ARCHES.get(item.lower(), item).split(";")
    flags = []
    for item in entries:
        match = re.fullmatch(r"(?:sm_)?(\d+)\.?(\d)([af]?)(\+PTX)?", item, re.I)
        if not match:
            raise BuildError(f"cannot read CUDA arch {item!r} in TORCH_CUDA_ARCH_LIST={spec!r}; use e.g. 9.0, 9.0a or 8.0;9.0")
        num = f"{match.group(1)}{match.group(2)}{match.group(3).lower()}"
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return list(dict.fromkeys(flags))


def optional_cuda_libs(cuda_home: str, torch_dir: str) -> tuple[list[str], list[str], list[str]]:
    """cuBLAS/cuDNN (the allowed libraries): include dirs, lib dirs, -l flags, where installed."""
    nvidia = Path(torch_dir).parent / "nvidia"  # the CUDA libraries pip installs with torch
    lib_dirs = [Path(cuda_home) / "lib64", *sorted(nvidia.glob("*/lib"))]
    inc_dirs = [Path(cuda_home) / "include", *sorted(nvidia.glob("*/include"))]
    includes, libdirs, libs = [], [], []
    for header, lib in (("cublas_v2.h", "cublas"), ("cublasLt.h", "cublasLt"), ("cudnn.h", "cudnn")):
        inc = next((d for d in inc_dirs if (d / header).is_file()), None)
        found = None
        for d in lib_dirs:
            names = sorted(p.name for p in d.glob(f"lib{lib}.so*")) if d.is_dir() else []
            if names:
                found = (d, f"-l{lib}" if f"lib{lib}.so" in names else f"-l:{names[0]}")
                break
        if inc and found:
            if inc != Path(cuda_home) / "include" and str(inc) not in includes:
                includes.append(str(inc))
            if str(found[0]) not in libdirs:
                libdirs.append(str(found[0]))
            libs.append(found[1])
    return includes, libdirs, libs


# --------------------------------------------------------------------------- precompiled torch headers
#
# Parsing torch's and pybind11's headers is most of a binding source's compile time (~14 s of
# relu_add_binding.cpp's on a small box; 7 s with the headers precompiled). The trusted host
# precompiles them once per toolchain (`kernel-env headers`, or in the background when the first
# C++ or CUDA sandbox starts) into a folder every sandbox sees read-only at $KE_HEADERS, one
# subfolder per key of the compiler and its flags. A source whose first directive includes a
# torch, ATen, c10, pybind11 or binding_registry.h header is compiled with `-include` of it; g++
# checks the precompiled file itself and, should it not fit, reads the plain header instead.


def header_key(flags: dict) -> str:
    """Names the precompiled header that fits this compiler and these flags."""
    cxx = os.path.realpath(flags["cxx"])
    stat = os.stat(cxx)
    parts = [cxx, str((stat.st_size, stat.st_mtime_ns)), *flags["cxxflags"], PCH_TEXT]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def precompiled_header(flags: dict) -> str | None:
    """The precompiled header this workspace's compiles include, or None. The choice sticks to
    a workspace's build: one begun without goes on without (else a header that turns up later
    would recompile every torch source of an unchanged workspace), until build/ is removed."""
    root = os.environ.get(HEADERS_ENV)
    header = str(Path(root) / header_key(flags) / PCH_NAME) if root else None
    usable = header is not None and Path(header + ".gch").is_file()
    try:
        previous = re.search(rf"^{PCH_VARIABLE} = (.*)$", (BUILD / "build.ninja").read_text(), re.M)
    except OSError:  # the first build of this workspace
        return header if usable else None
    chosen = shlex.split(previous.group(1))[0] if previous and previous.group(1) else None
    return header if usable and chosen == header else None


def starts_with_torch(source: Path) -> bool:
    """Whether the source's first directive (after `#pragma once`) includes a torch-side header."""
    for line in source.read_text(errors="replace").splitlines():
        directive = line.strip()
        if directive.startswith("#") and not re.match(r"#\s*pragma\s+once\b", directive):
            return bool(TORCH_INCLUDE.match(directive))
    return False


def binding_sources_hash() -> str | None:
    """Names what binding.cpp compiles to: its text and binding_registry.h's (None without them)."""
    try:
        return hashlib.sha256(Path("binding.cpp").read_bytes() + b"\0" + Path("binding_registry.h").read_bytes()).hexdigest()[:20]
    except OSError:
        return None


def prebuilt_binding(header: str | None) -> str | None:
    """binding.cpp's object, compiled by the host beside the precompiled header it fits (both are
    fixed, protected files: every workspace of a toolchain compiles them to the same object), or None."""
    digest = binding_sources_hash()
    if header is None or digest is None:
        return None
    found = Path(header).parent / f"binding-{digest}.o"
    return str(found) if found.is_file() else None


def precompile(root: Path) -> int:
    """Precompile, for this workspace's toolchain, into root/<key>/: the torch headers, and the
    object of binding.cpp built with them; and write the toolchain's settings to
    root/toolchain-<key>.json (the trusted host runs this, never a sandbox). Each is written
    under another name and renamed into place, so a reader sees a whole file or none."""
    start = time.monotonic()
    kind = workspace_kind()
    if kind == "triton":
        say("nothing to precompile: a Triton workspace builds no C++")
        return 0
    settings = torch_settings()
    flags = compiler_flags(kind, settings, find_cuda() if kind == "cuda" else None)
    root.mkdir(parents=True, exist_ok=True)
    _publish(root / f"toolchain-{settings['key']}.json", json.dumps(settings, indent=1).encode())
    target = root / header_key(flags)
    header = target / PCH_NAME
    made = []
    if not Path(f"{header}.gch").is_file():
        problem = _precompile_header(root, target, flags)
        if problem:
            say(problem)
            say("PRECOMPILE FAILED")
            return 1
        made.append(f"{Path(f'{header}.gch').stat().st_size >> 20} MB")
    digest = binding_sources_hash()
    if digest and not (target / f"binding-{digest}.o").is_file():
        with tempfile.TemporaryDirectory(prefix="kernel_env_binding_") as scratch:
            obj = Path(scratch) / "binding.o"
            proc = subprocess.run([flags["cxx"], *flags["cxxflags"], "-include", str(header), "-c", "binding.cpp", "-o", str(obj)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                say(clip(" ".join(proc.stderr.split())) or f"g++ exited with status {proc.returncode}")
                say("PRECOMPILE FAILED (binding.cpp)")
                return 1
            _publish(target / f"binding-{digest}.o", obj.read_bytes())
        made.append(f"binding-{digest}.o")
    say(f"PRECOMPILED: {header} ({', '.join([*made, f'{time.monotonic() - start:.1f}s']) if made else 'already there'})")
    return 0


def _precompile_header(root: Path, target: Path, flags: dict) -> str | None:
    """Make target/PCH_NAME(.gch) in a scratch folder renamed into place; the problem, or None."""
    for stale in root.glob(".partial-*"):  # left by a process killed while it compiled
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    header = scratch / PCH_NAME
    header.write_text(PCH_TEXT)
    proc = subprocess.run([flags["cxx"], *flags["cxxflags"], "-x", "c++-header", str(header), "-o", f"{header}.gch"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        return clip(" ".join(proc.stderr.split())) or f"g++ exited with status {proc.returncode}"
    for path in (scratch, header, Path(f"{header}.gch")):
        path.chmod(0o755 if path.is_dir() else 0o644)  # every sandbox's user reads it
    try:
        scratch.rename(target)
    except OSError:  # another process put the same header in place first
        shutil.rmtree(scratch, ignore_errors=True)
    return None


def _publish(path: Path, data: bytes) -> None:
    """Write a file every sandbox's user may read, whole or not at all."""
    partial = path.with_name(f".partial-{os.getpid()}-{path.name}")
    partial.write_bytes(data)
    partial.chmod(0o644)
    partial.rename(path)


# --------------------------------------------------------------------------- ninja file


def q(arg: str) -> str:
    """Quote for the shell line ninja runs, and escape ninja's own `$`."""
    return shlex.quote(arg).replace("$", "$$")


def object_path(source: Path) -> str:
    return f"{BUILD}/obj/{source}.o"


def compiler_flags(kind: str, settings: dict, cuda: tuple[str, str] | None) -> dict:
    """The compilers and their flags: cxx, cxxflags, ldflags (and nvcc, cudaflags), describe."""
    cxx = find_tool("g++")
    if not cxx:
        raise BuildError("no g++ on PATH; the C++ toolchain is missing from this sandbox")
    includes = [*settings["include_dirs"], settings["python_include"]]
    local = ["-I."]  # the workspace root: kernels may write "binding_registry.h" or "../binding_registry.h"
    defines = [f"-D_GLIBCXX_USE_CXX11_ABI={settings['cxx11_abi']}", f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    cxxflags = ["-O3", f"-std={settings['cxx_std']}", "-fPIC", "-fdiagnostics-color=never", "-fno-diagnostics-show-line-numbers", "-fdiagnostics-urls=never", "-fmax-errors=20", *defines]
    lib_dirs = list(settings["lib_dirs"])
    libs = ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    optional_libs: list[str] = []
    cudaflags: list[str] = []
    describe = f"g++ -O3 -std={settings['cxx_std']}"
    if kind == "cpp":
        cxxflags.append("-fopenmp")
        libs.append("-fopenmp")
        describe += " -fopenmp"
    if cuda:
        nvcc, home = cuda
        extra_inc, extra_libdirs, optional_libs = optional_cuda_libs(home, settings["torch_dir"])
        includes += [f"{home}/include", *extra_inc]
        lib_dirs += [f"{home}/lib64", *extra_libdirs]
        libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
        arch = cuda_arch_flags()
        cudaflags = ["-O3", f"-std={settings['cxx_std']}", "-lineinfo", "--expt-relaxed-constexpr", "--extended-lambda",
                     "-ccbin", cxx, "-Xcompiler", "-fPIC", *defines, *arch]
        describe += f"; nvcc -O3 {' '.join(a.split(',')[1] for a in arch)}"
    inc_flags = [f for d in dict.fromkeys(includes) for f in ("-isystem", d)]
    lib_dirs = list(dict.fromkeys(lib_dirs))
    ldflags = ["-shared", *[f"-L{d}" for d in lib_dirs], *libs, *[f"-Wl,-rpath,{d}" for d in lib_dirs]]
    if optional_libs:
        ldflags += ["-Wl,--push-state,--as-needed", *optional_libs, "-Wl,--pop-state"]
    return {"cxx": cxx, "cxxflags": cxxflags + local + inc_flags, "ldflags": ldflags, "describe": describe,
            "nvcc": cuda[0] if cuda else None, "cudaflags": cudaflags + local + inc_flags}


def ninja_file(kind: str, sources: list[Path], artifact: str, settings: dict, cuda: tuple[str, str] | None) -> tuple[str, str]:
    """Returns (build.ninja text, one-line description of the toolchain)."""
    flags = compiler_flags(kind, settings, cuda)
    describe = flags["describe"]
    header = precompiled_header(flags)
    if header:
        describe += ", precompiled torch headers"
    lines = [
        "# Generated by utils/build.py; edits are overwritten.",
        "ninja_required_version = 1.3",
        f"builddir = {BUILD}",
        f"cxx = {q(flags['cxx'])}",
        f"cxxflags = {' '.join(q(f) for f in flags['cxxflags'])}",
        f"ldflags = {' '.join(q(f) for f in flags['ldflags'])}",
        f"{PCH_VARIABLE} = {q(header) if header else ''}",
        "",
        "rule cxx",
        "  command = $cxx -MD -MF $out.d $cxxflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        "",
        "rule cxx_pch",
        "  command = $cxx -MD -MF $out.d $cxxflags -include $pch -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        "",
        "rule link",
        "  command = $cxx $in -o $out $ldflags",
        "  description = LINK $out",
        "",
    ]
    if cuda:
        lines[4:4] = [f"nvcc = {q(flags['nvcc'])}", f"cudaflags = {' '.join(q(f) for f in flags['cudaflags'])}"]
        lines += [
            "rule cuda",
            "  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d $cudaflags -c $in -o $out",
            "  depfile = $out.d",
            "  deps = gcc",
            "  description = NVCC $in",
            "",
        ]
    binding = prebuilt_binding(header)
    objects = []
    for src in sources:
        if binding and src == Path("binding.cpp"):
            objects.append(re.sub(r"([$ :])", r"$\1", binding))  # the host's, read-only: nothing to compile
            continue
        rule = "cuda" if src.suffix == ".cu" else "cxx_pch" if header and starts_with_torch(src) else "cxx"
        lines.append(f"build {object_path(src)}: {rule} {src}")
        objects.append(object_path(src))
    lines.append(f"build {artifact}: link {' '.join(objects)}")
    lines.append(f"default {artifact}")
    if binding:
        describe += ", binding.cpp prebuilt"
    return "\n".join(lines) + "\n", describe


# --------------------------------------------------------------------------- ninja output


HEADLINE = re.compile(
    r"^(?:(?P<loc>\S[^:]*:\d+(?::\d+)?|\S[^(]*\(\d+\))\s*:\s*(?P<sev>fatal error|catastrophic error|error|warning)\b"
    r"|(?P<ld>.*(?:undefined reference to|multiple definition of|ld: cannot find|ld returned).*)"
    r"|(?P<fatal>(?:nvcc fatal|ptxas (?:fatal|error)|g\+\+: fatal error|cc1plus: (?:fatal )?error).*))"
)
PREAMBLE = re.compile(r"(In file included from|from \S+:\d+|In instantiation of|required from|In function|In member function|At global scope|In lambda function|In constructor|In static member)")


def run_ninja(ninja: str, targets: list[str]) -> tuple[int, list[dict], list[str]]:
    """Run ninja, echo one line per step; returns (exit code, steps, ninja's own error lines)."""
    env = dict(os.environ, NINJA_STATUS=NINJA_STATUS + "[%f/%t] ", LC_ALL="C", CCACHE_DISABLE="1", TERM="dumb")
    cmd = [ninja, "-f", str(BUILD / "build.ninja"), "-k", "0", *targets]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    steps: list[dict] = []
    ninja_errors: list[str] = []
    skip_command = False
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if skip_command:  # the (long) command line ninja prints after FAILED:
            skip_command = False
            continue
        if line.startswith(NINJA_STATUS):
            desc = line[len(NINJA_STATUS):]
            action = desc.split("] ", 1)[-1]  # "CXX kernels/x.cpp", "NVCC kernels/x.cu", "LINK build/..."
            steps.append({"desc": desc, "action": action, "source": action.split(" ", 1)[-1], "failed": False, "output": []})
            say("  " + desc)
        elif line.startswith("FAILED: "):
            if steps:
                steps[-1]["failed"] = True
            skip_command = True
        elif line.startswith("ninja: "):
            if "build stopped" not in line and "no work to do" not in line and "Entering directory" not in line:
                ninja_errors.append(line)
        elif steps:
            steps[-1]["output"].append(line)
        elif line.strip():
            ninja_errors.append(line)
    return proc.wait(), steps, ninja_errors


def summarise(lines: list[str], max_errors: int) -> tuple[list[str], int, list[str], int]:
    """(error excerpt, error count, warning excerpt, warning count) from one compiler's output."""
    errors: list[list[str]] = []
    warnings: list[list[str]] = []
    current: list[str] | None = None
    preamble: list[str] = []
    for line in lines:
        match = HEADLINE.match(line)
        if match:
            is_warning = match.group("sev") == "warning"
            block = [clip(p) for p in preamble[-2:]] + [clip(line)]
            (warnings if is_warning else errors).append(block)
            current, preamble = block, []
            continue
        if PREAMBLE.search(line) and not line.startswith(" "):
            # context that precedes the next diagnostic; keep the lines naming the agent's files
            if "kernels/" in line or "binding" in line or "model" in line:
                preamble.append(line)
            current = None
            continue
        if current is not None and len(current) < CONTEXT_LINES + 1 and line.strip() and not re.match(r"^\d+ errors? detected", line) and line != "compilation terminated.":
            current.append(clip(line))
    error_lines = [ln for block in errors[:max_errors] for ln in block]
    warning_lines = [ln for block in warnings[:MAX_WARNINGS] for ln in block[: 3]]
    if not errors and lines:  # a format we do not know: show the head and the tail
        text = [clip(ln) for ln in lines if ln.strip()]
        error_lines = text[:25] + (["..."] + text[-8:] if len(text) > 33 else text[25:])
    return error_lines, len(errors), warning_lines, len(warnings)


# --------------------------------------------------------------------------- C++ / CUDA build


def collect_sources(kind: str, only: list[str]) -> tuple[list[Path], list[Path]]:
    """(every source of the module, the ones to compile now)."""
    kernels = Path("kernels")
    cpp = sorted(kernels.glob("*.cpp"))
    cu = sorted(kernels.glob("*.cu"))
    ignored = sorted(p for ext in ("*.cc", "*.cxx", "*.c", "*.C") for p in kernels.glob(ext))
    for p in ignored:
        say(f"warning: {p} is not built (only kernels/*.cpp{' and kernels/*.cu' if kind == 'cuda' else ''} are); rename it")
    if kind == "cpp" and cu:
        raise BuildError(f"{', '.join(map(str, cu))}: this is a CPU C++ workspace; CUDA sources are not built here (write C++ in kernels/*.cpp)")
    if not cpp and not cu:
        what = "kernels/<op>.cu (kernels + launcher) and kernels/<op>_binding.cpp" if kind == "cuda" else "kernels/<op>.cpp and kernels/<op>_binding.cpp"
        raise BuildError(f"no kernels to build: kernels/ holds no .cpp or .cu files; write {what} (see SKILL.md)")
    for p in cpp + cu:
        if not SAFE_NAME.match(p.name):
            raise BuildError(f"{p}: rename it; source names may use only letters, digits and _ . + -")
    if not Path("binding.cpp").is_file():
        raise BuildError("binding.cpp is missing from the workspace; it is protected and must not be removed")
    registered: dict[str, Path] = {}
    for p in cpp + cu:
        for name in re.findall(r"^\s*REGISTER_BINDING\(\s*(\w+)", p.read_text(errors="replace"), re.M):
            if name in registered:
                raise BuildError(f"REGISTER_BINDING({name}, ...) appears in both {registered[name]} and {p}; names must be unique")
            registered[name] = p
    if not registered:
        say("warning: no kernels/*.cpp calls REGISTER_BINDING(name, fn): cuda_extension will export no functions")
    sources = [Path("binding.cpp"), *cpp, *cu]
    if only:
        wanted = []
        for arg in only:
            path = Path(os.path.relpath(Path(arg).resolve(), ROOT)) if Path(arg).is_absolute() else Path(arg)
            if path not in sources:
                raise BuildError(f"{arg}: not one of the sources this build compiles ({', '.join(map(str, sources))})")
            wanted.append(path)
        return sources, wanted
    return sources, sources


def load_check(artifact: str) -> str | None:
    """dlopen the module (RTLD_NOW) in a child process; returns the error line, or None.

    This catches what the linker lets through in a shared library (an undefined symbol: a
    launcher declared in a binding but named differently in the .cu) here, instead of on the
    GPU worker. It costs ~1 s; a full `import torch, cuda_extension` would cost ~3-4 s.
    """
    code = f"import ctypes; ctypes.CDLL({str(Path(artifact).resolve())!r})"
    try:
        proc = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "loading the module took over 120 s (a static initialiser that never returns?)"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else f"the loading process died (exit status {proc.returncode}; a static initialiser crashed?)"
    text = re.sub(r"^OSError: \S+: ", "", text)
    cxxfilt = shutil.which("c++filt")
    for symbol in sorted(set(re.findall(r"\b_Z\w+", text))) if cxxfilt else []:
        try:
            plain = subprocess.run([cxxfilt, symbol], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if plain and plain != symbol:
            text = text.replace(symbol, f"{plain} ({symbol})")
    return clip(text)


LOADED = BUILD / ".loaded.json"  # the undefined symbols of the last module that loaded, and its link line


def undefined_symbols(artifact: str) -> set[str] | None:
    """The module's undefined dynamic symbols (nm -D), or None where nm cannot say."""
    nm = find_tool("nm")
    if not nm:
        return None
    try:
        proc = subprocess.run([nm, "-D", "--undefined-only", artifact], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}


def _link_key(ninja_text: str) -> str:
    """What the module is linked against: the link flags (libraries, their folders, rpaths)."""
    flags = re.search(r"^ldflags = (.*)$", ninja_text, re.M)
    return hashlib.sha256((flags.group(1) if flags else "").encode()).hexdigest()[:20]


def loaded_symbols(ninja_text: str) -> set[str]:
    """The undefined symbols of the last module of this build that loaded, with the same link flags."""
    try:
        seen = json.loads(LOADED.read_text())
    except (OSError, ValueError):
        return set()
    return set(seen.get("undefined", ())) if isinstance(seen, dict) and seen.get("link") == _link_key(ninja_text) else set()


def remember_loaded(needs: set[str] | None, ninja_text: str) -> None:
    if needs is None:
        LOADED.unlink(missing_ok=True)
    else:
        LOADED.write_text(json.dumps({"link": _link_key(ninja_text), "undefined": sorted(needs)}))


def remove_stale() -> str:
    """Delete the module after a failed build, so no stale build can be verified by mistake."""
    removed = []
    (BUILD / "build_info.json").unlink(missing_ok=True)
    for p in BUILD.glob(f"{MODULE}*.so"):
        p.unlink()
        removed.append(str(p))
    return f"; removed the stale {', '.join(removed)}" if removed else ""


def write_build_info(kind: str, artifact: str, settings: dict) -> None:
    """build/build_info.json: what the module was built from, so a stale build can be detected."""
    files = sorted(p for p in [Path("binding.cpp"), Path("binding_registry.h"), *Path("kernels").rglob("*")] if p.is_file())
    info = {
        "kind": kind, "artifact": artifact, "torch": settings["torch_version"], "built_at": time.time(),
        "sources": {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
    }
    (BUILD / "build_info.json").write_text(json.dumps(info, indent=1))


def build_extension(kind: str, only: list[str], start: float, model_ok: bool = True) -> int:
    """Build (or, with ``only``, compile) the extension; the last line says how it went. With
    ``model_ok`` False (model_new.py has a syntax error, shown before) a build that worked still
    ends in BUILD FAILED: ModelNew cannot be imported, so the workspace is not ready."""
    sources, targets = collect_sources(kind, only)
    cuda = find_cuda() if kind == "cuda" else None
    settings = torch_settings()
    artifact = f"{BUILD}/{MODULE}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    text, describe = ninja_file(kind, sources, artifact, settings, cuda)
    BUILD.mkdir(exist_ok=True)
    ninja_path = BUILD / "build.ninja"
    if not ninja_path.exists() or ninja_path.read_text() != text:
        ninja_path.write_text(text)
    ninja = find_tool("ninja", [str(Path(sys.executable).parent / "ninja")])
    if not ninja:
        raise BuildError("no ninja found (PATH or next to python3); the build tool is missing from this sandbox")
    label = {"cuda": "CUDA", "cpp": "CPU C++"}[kind]
    say(f"build: {label} workspace, torch {settings['torch_version']}, {describe}")
    if kind == "cuda" and not any(s.suffix == ".cu" for s in sources):
        say("note: no kernels/*.cu; building the C++ files only")

    def done(line: str, what: str) -> int:  # the last line of a build that worked: OK, unless model_new.py is broken
        if model_ok:
            say(line)
            return 0
        say(f"BUILD FAILED: model_new.py has a syntax error (above); {what} ({elapsed()})")
        return 1

    built_here = [s for s in targets if f"build {object_path(s)}:" in text]  # binding.cpp may be the host's
    elapsed = lambda: f"{time.monotonic() - start:.1f}s"  # noqa: E731
    if only and not built_here:
        return done(f"COMPILE OK: {', '.join(map(str, targets))} (precompiled by the host; nothing to compile)",
                    "the named sources are the host's")
    rc, steps, ninja_errors = run_ninja(ninja, [object_path(s) for s in built_here] if only else [])
    compiled = [s for s in steps if not s["action"].startswith("LINK")]
    failed = [s for s in steps if s["failed"]]

    shown = 0
    for step in steps:
        budget = max(0, min(MAX_ERRORS_PER_FILE, MAX_ERRORS - shown))
        errs, n_err, warns, n_warn = summarise(step["output"], budget)
        if warns and not step["failed"]:
            for ln in warns:
                say(ln)
            if n_warn > MAX_WARNINGS:
                say(f"  ... {n_warn - MAX_WARNINGS} more warnings")
        if step["failed"]:
            say(f"---- {step['source']}: {n_err or 'unknown'} error(s)" + (f", first {min(n_err, budget)} shown" if n_err > budget else ""))
            for ln in errs:
                say(ln)
            shown += min(n_err, budget) or 1
    for ln in ninja_errors:
        say(clip(ln))

    if rc != 0 or failed:
        names = [s["source"] for s in failed]
        reason = f"{', '.join(names)} failed" if names else "ninja failed"
        say(f"BUILD FAILED: {reason}{remove_stale()} ({elapsed()})")
        return 1
    rebuilt = len(compiled)
    if only:
        return done(f"COMPILE OK: {', '.join(map(str, targets))} ({rebuilt} rebuilt, {elapsed()}); not linked: run "
                    "bash utils/compile.sh to build the module", "the named sources compiled")
    # A module that failed this check was removed, so an unchanged one has passed it before; so
    # has a relinked one that needs no symbol the last module that loaded did not (same libraries).
    if rebuilt or not Path(artifact).exists():
        needs = undefined_symbols(artifact)
        if needs is None or not needs <= loaded_symbols(text):
            problem = load_check(artifact)
            if problem:
                say(f"loading {artifact} failed: {problem}")
                say(f"BUILD FAILED: the module does not load{remove_stale()} ({elapsed()})")
                return 1
            remember_loaded(needs, text)
    write_build_info(kind, artifact, settings)
    return done(f"BUILD OK: {artifact} ({len(sources)} objects, {rebuilt} rebuilt, {elapsed()})",
                f"the module itself built: {artifact}")


def main(argv: list[str]) -> int:
    start = time.monotonic()
    os.chdir(ROOT)
    if argv[:1] == ["--precompile"] and len(argv) == 2:
        try:
            return precompile(Path(argv[1]).resolve())
        except BuildError as exc:
            say(f"PRECOMPILE FAILED: {exc}")
            return 1
    only = [a for a in argv if not a.startswith("-")]
    if any(a in ("-h", "--help") for a in argv):
        say(__doc__.split("\n\n")[0] + "\n" + __doc__.split("\n\n")[1])
        return 0
    kind = workspace_kind()
    try:
        if kind == "triton":
            return check_python_sources()
        # Shown first, so that the build's last line is the only verdict (never BUILD OK, then FAILED).
        model_errors = syntax_errors([Path("model_new.py")]) if Path("model_new.py").is_file() else []
        if model_errors:
            say(f"---- model_new.py: {len(model_errors)} syntax error(s)")
            for err in model_errors:
                say(err)
        return build_extension(kind, only, start, model_ok=not model_errors)
    except BuildError as exc:
        say(f"BUILD FAILED: {exc}{remove_stale() if kind != 'triton' and BUILD.is_dir() else ''}")
        return 1
    except OSError as exc:  # e.g. build/ not writable: one line, not a traceback
        say(f"BUILD FAILED: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        return 1


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main(sys.argv[1:]))
