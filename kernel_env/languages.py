"""The kernel languages an agent can write in, and what differs between them.

Everything language-specific that the rest of the code needs is a field here, so the
workspace, the build and the harness never branch on a language name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    name: str
    #: Files the agent's kernels live in (globs relative to the workspace).
    kernel_globs: tuple[str, ...]
    #: Whether utils/compile.sh builds the ``cuda_extension`` module from kernels/.
    builds_extension: bool
    #: Whether candidates need a CUDA device to run at all (cpp runs on the CPU; triton uses
    #: the interpreter when there is no GPU).
    needs_cuda: bool
    #: The tag a model wraps its code in for the refine loop (``<triton>…</triton>``).
    code_tag: str
    #: Template files that only make sense for this language.
    template_files: tuple[str, ...]


_BINDING_FILES = ("binding.cpp", "binding_registry.h")

LANGUAGES: dict[str, Language] = {
    "cuda": Language("cuda", ("kernels/*.cu", "kernels/*.cuh", "kernels/*_binding.cpp"), True, True, "cuda", _BINDING_FILES),
    "cpp": Language("cpp", ("kernels/*.cpp", "kernels/*.h"), True, False, "cpp", _BINDING_FILES),
    "triton": Language("triton", ("kernels/*.py",), False, False, "triton", ()),
}


def get_language(name: str) -> Language:
    try:
        return LANGUAGES[name]
    except KeyError:
        raise ValueError(f"unknown language {name!r}; choose one of {', '.join(LANGUAGES)}") from None
