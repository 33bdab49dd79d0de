"""utils/build_load.py — the build's load check of a linked module (PROTECTED: read-only, hash-checked).

Part of utils/build.py (run that, through ``bash utils/compile.sh``). A shared library links with
symbols still undefined (a launcher declared in a binding but named differently in the .cu);
``check_loads`` finds that here, by loading the module (dlopen, RTLD_NOW) in a child process,
rather than on the GPU worker. The check costs about a second (it loads torch's libraries), so
it is skipped for a module that needs no dynamic symbol (``nm -D``) that the last module of this
workspace that loaded did not, with the same link flags (``build/.loaded.json``): an edit inside
a kernel.

Standard library only. It must never import the module into this process, or write outside ``build/``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from build_toolchain import BUILD, clip, find_tool

LOADED = BUILD / ".loaded.json"  # the undefined symbols of the last module that loaded, and its link line


def check_loads(artifact: str, ninja_text: str) -> str | None:
    """Whether the freshly linked ``artifact`` (built by ``ninja_text``) loads: the error line,
    or None. Loads it unless the last module that loaded needed every symbol it needs."""
    needs = undefined_symbols(artifact)
    if needs is not None and needs <= loaded_symbols(ninja_text):
        return None
    problem = load_check(artifact)
    if problem is None:
        remember_loaded(needs, ninja_text)
    return problem


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

