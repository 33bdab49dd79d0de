"""Run-time rule enforcement inside the candidate process (defence in depth).

- ``TorchComputeAudit``: a dispatch mode that sees every ATen operator a forward runs, from
  Python *and* from C++ extensions, and records those that compute (anything but
  allocation, views, copies and fills). The skill forbids torch compute in ModelNew.forward.
- ``KernelLaunchCounter``: counts Triton kernel launches (compiled or interpreted), so a
  Triton candidate that never launches a kernel is caught.
- ``Integrity``: identities of the functions and classes the harness relies on, taken before
  the candidate is imported and compared afterwards, so monkey-patching a timer, a
  comparison or a random-number generator is reported.

None of this is the last line: the parent process never trusts what the child reports
about correctness (it compares outputs itself) and checks timing against its own clock.
"""

from __future__ import annotations

import os
import sys
import threading
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen operators that move, allocate, view or fill memory but do not compute. Compared on
# the overload packet's name, e.g. "empty_like" for aten.empty_like.default.
ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "new_zeros", "new_ones", "new_full", "fill_", "zero_", "fill",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "flatten", "unflatten", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "view_as", "alias", "detach", "contiguous", "clone", "copy_", "_to_copy", "to", "lift_fresh", "_local_scalar_dense",
    "size", "stride", "numel", "dim", "is_contiguous", "resize_", "set_", "item", "sym_size", "sym_stride", "sym_numel",
    "record_stream", "empty_permuted", "_copy_from", "_copy_from_and_resize", "as_strided_", "unsafe_split",
    "_unsafe_index", "diagonal", "movedim", "expand_as", "view_as_real", "view_as_complex", "_conj", "conj",
    "resolve_conj", "resolve_neg", "is_same_size", "equal", "_has_compatible_shallow_copy_type", "result_type",
    "scalar_tensor", "arange",
})


#: Copies of more elements than this from the GPU to the host are data leaving for a host-side
#: computation (which the copy engines could even overlap with the launch cover), not a size read.
HOST_COPY_LIMIT = 1024


class TorchComputeAudit(TorchDispatchMode):
    """Records the computing ATen operators run while active, and copies of data from the GPU
    to the host (the skill wants the outputs computed on the device)."""

    def __init__(self):
        super().__init__()
        self.forbidden: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name not in ALLOWED_ATEN:
            self.forbidden[name] = self.forbidden.get(name, 0) + 1
        out = func(*args, **(kwargs or {}))
        if name in ("_to_copy", "copy_", "_copy_from", "_copy_from_and_resize") and _copies_to_host(name, args, out):
            key = f"{name} from the GPU to the host"
            self.forbidden[key] = self.forbidden.get(key, 0) + 1
        return out


def _copies_to_host(name: str, args, out) -> bool:
    """Whether a copy op moved more than HOST_COPY_LIMIT elements from a CUDA tensor into a CPU one."""
    if name == "_to_copy":
        source, target = (args[0] if args else None), out
    elif name == "copy_":
        target, source = (args[0], args[1]) if len(args) > 1 else (None, None)
    else:  # _copy_from(self, dst)
        source, target = (args[0], args[1]) if len(args) > 1 else (None, None)
    return (isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor) and source.device.type == "cuda"
            and target.device.type == "cpu" and source.numel() > HOST_COPY_LIMIT)


class KernelLaunchCounter:
    """Counts Triton launches by wrapping the launch entry points (installed before candidate import)."""

    def __init__(self):
        self.launches = 0
        self._installed = False

    def install(self) -> None:
        try:
            from triton.runtime import interpreter, jit
        except ImportError:
            return
        counter = self
        for cls in (jit.JITFunction, interpreter.InterpretedFunction):
            original = cls.run

            def run(self, *args, __original=original, **kwargs):
                counter.launches += 1
                return __original(self, *args, **kwargs)

            run.__wrapped__ = original
            cls.run = run
        self._installed = True


def _identities(obj) -> dict[str, int]:
    try:
        return {name: id(value) for name, value in vars(obj).items()}
    except TypeError:
        return {}


def _watched() -> dict[str, object]:
    import math
    import time

    watched = {
        "torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.functional": torch.nn.functional,
        "torch.nn.Module": torch.nn.Module, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
        "torch.testing": torch.testing, "torch.random": torch.random, "time": time, "math": math,
        "torch.backends.cudnn": torch.backends.cudnn, "torch.backends.cuda.matmul": torch.backends.cuda.matmul,
        "TorchDispatchMode": TorchDispatchMode,
    }
    for name in ("timing", "guards", "__main__"):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            watched[name] = module
            # The harness's classes too: replacing a method is as good as replacing a function.
            for attr, value in vars(module).items():
                if isinstance(value, type) and value.__module__ == module.__name__:
                    watched[f"{name}.{attr}"] = value
    try:
        from triton.runtime import interpreter, jit

        watched["triton.JITFunction"] = jit.JITFunction
        watched["triton.InterpretedFunction"] = interpreter.InterpretedFunction
    except ImportError:
        pass
    return watched


def preload() -> None:
    """Import what honest code imports lazily and what patches torch on import (torch._dynamo
    wraps torch.manual_seed), so the snapshot below is taken of the settled state."""
    import torch._dynamo  # noqa: F401

    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        pass


_current_frames = sys._current_frames  # bound before any candidate code is imported


class Integrity:
    """Snapshot of what the harness relies on; ``changes()`` lists what was replaced since."""

    def __init__(self):
        preload()
        self._objects = _watched()
        self._snapshot = {name: _identities(obj) for name, obj in self._objects.items()}
        self._flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
                       torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
        self._threads = set(_current_frames())

    def changes(self) -> list[str]:
        found = []
        for name, obj in self._objects.items():
            now = _identities(obj)
            before = self._snapshot[name]
            # Only replacements count: lazily imported submodules legitimately add attributes.
            replaced = sorted(k for k in before if k in now and now[k] != before[k] and not k.startswith("__"))
            found += [f"{name}.{key} was replaced" for key in replaced[:5]]
        flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
                 torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
        if flags != self._flags:
            found.append("global torch settings (tf32, default dtype, determinism) were changed")
        return found

    def new_threads(self) -> list[str]:
        """Threads started since the snapshot, by the interpreter's own list of thread states: a
        thread started with ``_thread`` (reachable through any module that imported threading) is
        not in ``threading.enumerate()``."""
        names = {t.ident: t.name for t in threading.enumerate()}
        return [names.get(ident, f"a low-level thread ({ident})") for ident in _current_frames() if ident not in self._threads]


# Bound before any candidate code is imported: replacing them later changes nothing here.
_listdir, _getpid, _os_open, _os_read, _os_close = os.listdir, os.getpid, os.open, os.read, os.close


def _stat(pid: int) -> tuple[str, str, int] | None:
    """A process's name, state letter and parent pid, from /proc/PID/stat (None once it is gone)."""
    try:
        fd = _os_open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            text = _os_read(fd, 4096).decode(errors="replace")
        finally:
            _os_close(fd)
        head, _, tail = text.rpartition(")")
        fields = tail.split()
        return head.partition("(")[2], fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


class Processes:
    """Processes that appeared in this process's pid namespace since it was made (before the
    candidate's code was imported), other than this process and its ancestors.

    The device-wide synchronise that charges work left running after a timed call sees this
    process's CUDA context only: a helper process with a context of its own, fed the inputs
    through CUDA IPC, could compute after the end mark unseen. Honest kernels run in the
    evaluated process, so any other live process is reported. Only meaningful in a pid namespace
    of the child's own (bubblewrap), where /proc lists nothing else."""

    def __init__(self):
        self._before = set(self._others())

    @staticmethod
    def _others() -> dict[int, str]:
        me = _getpid()
        mine, pid = {me}, me
        while pid > 1 and (found := _stat(pid)) is not None:
            pid = found[2]
            mine.add(pid)
        live = {}
        for entry in _listdir("/proc"):
            if entry.isdigit() and int(entry) not in mine:
                found = _stat(int(entry))
                if found is not None and found[1] not in "ZXx":  # a dead process waiting to be reaped runs nothing
                    live[int(entry)] = found[0]
        return live

    def new(self) -> list[str]:
        """The new live processes, as "PID (name)"."""
        return [f"{pid} ({name})" for pid, name in sorted(self._others().items()) if pid not in self._before]
