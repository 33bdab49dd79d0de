"""utils/build_toolchain.py — the build's toolchain (PROTECTED: read-only, hash-checked).

Part of utils/build.py (run that, through ``bash utils/compile.sh``): what every other part of
the build shares (the build folder, ``BuildError``, the one-line output), the torch settings
(include and library folders, C++ ABI and standard; cached in ``build/.toolchain.json`` and in
the host's ``$KE_HEADERS/toolchain-<key>.json``), the compilers and their flags (g++, nvcc and
its ``-gencode`` flags, cuBLAS/cuDNN where installed), and the precompiled torch headers: the
one a build includes, and ``precompile``, which makes them (the trusted host's job, run as
``build.py --precompile DIR``, never a sandbox's).

Standard library only; torch is imported only when no cached settings fit. It must never write
outside ``build/``, a temp dir and (``precompile`` alone) the folder it is given, or use ccache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

BUILD = Path("build")  # relative to the workspace (build.py chdirs there), so compiler messages say kernels/x.cu:12
MODULE = "cuda_extension"
TOOLCHAIN_CACHE = BUILD / ".toolchain.json"
MAX_LINE = 400
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


# --------------------------------------------------------------------------- toolchain


def toolchain_key() -> str:
    """Identifies the Python + torch install + the build's scripts (build*.py) without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise BuildError(f"{sys.executable} cannot find torch; the build needs the Python that has torch installed")
    torch_dir = Path(spec.origin).parent
    version_file = torch_dir / "version.py"
    stat = version_file.stat() if version_file.exists() else None
    parts = [os.path.realpath(sys.executable), sys.version, str(torch_dir), str(stat and (stat.st_mtime_ns, stat.st_size)),
             *(hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(__file__).parent.glob("build*.py")))]
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


def precompile(root: Path, kind: str) -> int:
    """Precompile, for this workspace's toolchain (``kind``: 'cuda' or 'cpp'), into root/<key>/:
    the torch headers, and the object of binding.cpp built with them; and write the toolchain's
    settings to root/toolchain-<key>.json (the trusted host runs this, never a sandbox). Each is
    written under another name and renamed into place, so a reader sees a whole file or none."""
    start = time.monotonic()
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

