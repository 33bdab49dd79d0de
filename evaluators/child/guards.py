"""Run-time rule enforcement inside the candidate process (defence in depth).

- ``TorchComputeAudit``: a dispatch mode that sees every ATen operator a forward runs, from
  Python *and* from C++ extensions, and records those that compute (anything but
  allocation, views, copies and fills). The skill forbids torch compute in ModelNew.forward.
- ``KernelLaunchCounter``: counts Triton kernel launches (compiled or interpreted), so a
  Triton candidate that never launches a kernel is caught.
- ``Integrity``: identities of the functions and classes the harness relies on, taken before
  the candidate is imported and compared afterwards, so monkey-patching a timer, a
  comparison or a random-number generator is reported.
- ``modes_on_stack``: torch function and dispatch modes left on the stack after a call (a mode
  could compute an output lazily, when the harness reads it).

None of this is the anchor of trust: it runs in the worker's process, beside the candidate, so
each check can be subverted. The judge reads the outputs and owns the clock (``judge.py``); what
these checks report can only add violations.
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
    "scalar_tensor", "arange", "squeeze_", "unsqueeze_", "t_", "transpose_", "unfold", "swapaxes", "swapdims",
    "narrow_copy", "view_copy", "permute_copy", "transpose_copy", "t_copy", "unsqueeze_copy", "squeeze_copy",
})


#: More tensor elements than this handed to the host in one call (copies from the GPU, ``item()``
#: on any device) are data leaving for a host-side computation (which the copy engines could even
#: overlap with device work), not a size or a scalar read.
HOST_COPY_LIMIT = 1024


class TorchComputeAudit(TorchDispatchMode):
    """Records the computing ATen operators run while active, and tensor data handed to the host
    beyond ``HOST_COPY_LIMIT`` elements in all (the skill wants the outputs computed on the device;
    element by element, ``item()`` is a host-side computation's way in on any device)."""

    def __init__(self):
        super().__init__()
        self.forbidden: dict[str, int] = {}
        self.host_elements = 0

    def __enter__(self):
        _AUDITS.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        if self in _AUDITS:
            _AUDITS.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if getattr(func, "namespace", "aten") != "aten":  # an operator of the candidate's (torch.library) named like ATen's
            name = f"{func.namespace}::{name}"
        if name not in ALLOWED_ATEN:
            self.forbidden[name] = self.forbidden.get(name, 0) + 1
        out = func(*args, **(kwargs or {}))
        read = _handed_to_host(name, args, out)
        if read:
            self.handed(read, "item() (tensor elements read one by one by the host)" if name == "_local_scalar_dense"
                        else f"{name} from the GPU to the host")
        return out

    def handed(self, elements: int, key: str) -> None:
        """``elements`` of tensor data handed to the host (``key`` names how), against ``HOST_COPY_LIMIT`` in all."""
        self.host_elements += elements
        if self.host_elements > HOST_COPY_LIMIT:
            self.forbidden[key] = self.forbidden.get(key, 0) + 1


_AUDITS: list[TorchComputeAudit] = []  # the active audits (one at a time in practice)
_LAUNCHING = [0]  # depth of Triton launches in progress (KernelLaunchCounter): the interpreter's own reads


def _reader(name: str, original):
    def read(self, *args, **kwargs):
        if _AUDITS and not _LAUNCHING[0] and isinstance(self, torch.Tensor):
            _AUDITS[-1].handed(self.numel(), f"Tensor.{name.strip('_')} (tensor data handed to Python or numpy)")
        return original(self, *args, **kwargs)

    read.__wrapped__ = original
    return read


def watch_host_reads() -> None:
    """Wrap the tensor methods that hand a tensor's data to Python or numpy through no ATen operator,
    so the dispatch audit above sees nothing of them (numpy's arithmetic on the CPU device, whatever
    the spelling: np.asarray(x) calls __array__; map_/apply_ run a Python callable on every element).
    Called once in the candidate's process, before any candidate code (the integrity snapshot then
    holds the wrappers); never in the harness's own process, whose torch stays as it is."""
    for name in ("numpy", "tolist", "__array__", "__dlpack__", "map_", "map2_", "apply_"):
        method = getattr(torch.Tensor, name, None)
        if method is not None and not hasattr(method, "__wrapped__"):
            setattr(torch.Tensor, name, _reader(name, method))


def _handed_to_host(name: str, args, out) -> int:
    """How many tensor elements an op hands the host: a copy from a CUDA tensor into a CPU one, or an element read."""
    if name == "_local_scalar_dense":
        return 1
    if name == "_to_copy":
        source, target = (args[0] if args else None), out
    elif name in ("copy_", "_copy_from", "_copy_from_and_resize"):  # copy_(self, src); _copy_from(self, dst)
        target, source = ((args[0], args[1]) if name == "copy_" else (args[1], args[0])) if len(args) > 1 else (None, None)
    else:
        return 0
    if (isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor) and source.device.type == "cuda"
            and target.device.type == "cpu"):
        return source.numel()
    return 0


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
                _LAUNCHING[0] += 1
                try:
                    return __original(self, *args, **kwargs)
                finally:
                    _LAUNCHING[0] -= 1

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
        "torch.nn.Module": torch.nn.Module, "torch.nn.Parameter": torch.nn.Parameter, "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.testing": torch.testing, "torch.random": torch.random, "time": time, "math": math,
        "torch.backends.cudnn": torch.backends.cudnn, "torch.backends.cuda.matmul": torch.backends.cuda.matmul,
        "TorchDispatchMode": TorchDispatchMode,
    }
    for name in ("guards", "runner", "worker", "protocol", "exchange", "outputs", "compare", "screen", "zygote", "__main__"):  # __main__: zygote, in a forked child
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
    wraps torch.manual_seed), so the snapshot below is taken of the settled state; in a process
    for a GPU, also build Triton's driver module (a C compile, about a second, into this
    process's own cache: no CUDA context is made for it)."""
    import torch._dynamo  # noqa: F401

    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return
    if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
        try:
            triton.runtime.driver.active.utils  # noqa: B018 - the attribute's making is the point
        except Exception:  # noqa: BLE001 - the job will meet (and report) it in its own time
            pass


_current_frames = sys._current_frames  # bound before any candidate code is imported


class Integrity:
    """Snapshot of what the harness relies on; ``changes()`` lists what was replaced since.

    ``instances``: objects of the harness's own (the worker and what it holds). Every attribute
    of theirs is watched: one replaced, added or removed is a change, unless the harness itself
    made it (``accept``)."""

    def __init__(self, instances: dict[str, object] | None = None):
        preload()
        self._objects = _watched()
        self._instances = dict(instances or {})
        self._instance_ids = {name: _identities(obj) for name, obj in self._instances.items()}
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
            # A class's new attribute that hides one of a base class (torch.Tensor.to over TensorBase.to) is a replacement too.
            if isinstance(obj, type):
                replaced += sorted(k for k in now if k not in before and not k.startswith("__")
                                   and any(k in vars(base) for base in obj.__mro__[1:]))
            found += [f"{name}.{key} was replaced" for key in replaced[:5]]
        for name, obj in self._instances.items():
            now, before = _identities(obj), self._instance_ids[name]
            changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
            found += [f"{name}.{key} was {'replaced' if key in now and key in before else 'added' if key in now else 'removed'}"
                      for key in changed[:5]]
        flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
                 torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
        if flags != self._flags:
            found.append("global torch settings (tf32, default dtype, determinism) were changed")
        return found

    def accept(self, name: str, *keys: str) -> None:
        """The harness set ``name``'s attributes ``keys`` itself (the worker built its model): the snapshot follows."""
        now = _identities(self._instances[name])
        self._instance_ids[name].update({key: now[key] for key in keys if key in now})

    def new_threads(self) -> list[str]:
        """Threads started since the snapshot, by the interpreter's own list of thread states: a
        thread started with ``_thread`` (reachable through any module that imported threading) is
        not in ``threading.enumerate()``."""
        names = {t.ident: t.name for t in threading.enumerate()}
        return [names.get(ident, f"a low-level thread ({ident})") for ident in _current_frames() if ident not in self._threads]


try:  # bound before any candidate code is imported
    from torch.overrides import _get_current_function_mode_stack as _function_modes
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _dispatch_modes
except ImportError:  # an older torch: the lengths are all it says
    _function_modes = lambda: [None] * torch._C._len_torch_function_stack()  # noqa: E731
    _dispatch_modes = lambda: [None] * torch._C._len_torch_dispatch_stack()  # noqa: E731


def modes_on_stack() -> list[str]:
    """The torch function and dispatch modes on the stack, by class name: after a call, any is the
    candidate's (a mode left on the stack answers the harness's own torch calls, and could compute
    an output lazily when it is read)."""
    return [f"{type(m).__name__} (function mode)" for m in _function_modes()] + \
           [f"{type(m).__name__} (dispatch mode)" for m in _dispatch_modes()]


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
