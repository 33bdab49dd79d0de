"""utils/build.py — builds this workspace's kernels (PROTECTED: read-only, hash-checked).

Run it as ``bash utils/compile.sh`` (CUDA: ``TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh``, else
``KERNEL_ENV_CUDA_ARCH``, else 9.0: the sandbox has no GPU to ask). ``bash utils/compile.sh
kernels/foo.cu`` compiles just the named sources, without linking (a quick "does this compile?").

cuda / cpp: ninja compiles ``binding.cpp`` and ``kernels/*.cpp`` with g++, ``kernels/*.cu`` with
nvcc, only what changed (header edits included), links ``build/cuda_extension*.so`` (``import
cuda_extension`` with ``build/`` on ``sys.path``) and checks that it loads; ``model_new.py`` is
syntax-checked first. A failed build removes the module, so nothing stale is evaluated; a good one
writes ``build/build_info.json`` (each source's sha256). triton: nothing to build (kernels compile
at their first launch); ``model_new.py`` and ``kernels/*.py`` are syntax-checked.

The compiler's first errors come as file:line; the last line is ``BUILD OK``, ``COMPILE OK``,
``CHECK OK`` or ``BUILD FAILED``, and the exit status is 0 only on success. The flags are fixed
(``build_toolchain.compiler_flags``); ``build_ninja.py`` and ``build_load.py`` do the rest.

It must never write outside ``build/`` and a temp dir (``--precompile DIR``, the host's job: DIR),
use the network or ccache, import or run ``model_new.py``, or keep an old module after a failed build.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

# The build's modules sit beside this file: on sys.path when it runs as a script (compile.sh,
# the host's --precompile), not under ``python3 -I`` or when it is loaded by its path.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_load import check_loads
from build_ninja import ninja_file, object_path, run_ninja, show_steps
from build_toolchain import (
    BUILD,
    MODULE,
    BuildError,
    cuda_arch_flags,  # noqa: F401 - still build.cuda_arch_flags, as before the split
    find_cuda,
    find_tool,
    precompile,
    say,
    starts_with_torch,  # noqa: F401 - still build.starts_with_torch
    torch_settings,
)

ROOT = Path(__file__).resolve().parent.parent  # the workspace
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


# --------------------------------------------------------------------------- helpers


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
    show_steps(steps, ninja_errors)

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
        problem = check_loads(artifact, text)
        if problem:
            say(f"loading {artifact} failed: {problem}")
            say(f"BUILD FAILED: the module does not load{remove_stale()} ({elapsed()})")
            return 1
    write_build_info(kind, artifact, settings)
    return done(f"BUILD OK: {artifact} ({len(sources)} objects, {rebuilt} rebuilt, {elapsed()})",
                f"the module itself built: {artifact}")


def main(argv: list[str]) -> int:
    """The command line (what ``utils/compile.sh`` passes on).

    Args:
        argv: the sources to compile without linking (none: the whole build), ``--precompile DIR``
            (the trusted host's job, never a sandbox's) or ``-h`` / ``--help``.

    Returns:
        The exit status: 0 when the build, the compile or the check succeeded, else 1 (the last
        line printed says why)."""
    start = time.monotonic()
    os.chdir(ROOT)
    if argv[:1] == ["--precompile"] and len(argv) == 2:
        try:
            return precompile(Path(argv[1]).resolve(), workspace_kind())
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
