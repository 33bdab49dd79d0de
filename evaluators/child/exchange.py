"""Memory the judge and the worker share, and the GPU's flags between them.

The judge owns every buffer a call's inputs cross in; the worker maps it. An output the worker
cannot share by its own allocation's IPC handle (a view of an input, memory of another allocator,
every output on the CPU) it copies into a spill buffer the judge owns. The protocol these serve:
docs/design.md, What is trusted, and One call, and the clock.

- ``memfd``, ``mapped``, ``extent``, ``over``, ``write``, ``seal_writes``: (the CPU) a call's memfds, made by the judge for that call
  alone and sent over the judge–worker socket: its inputs with ``Go``, its spill buffer once the
  forward has returned, sealed against writes as the worker answers.
- ``DeviceMemory``: (a GPU) the CUDA driver calls both sides need: allocations, IPC handles and
  stream memory operations (``cuStreamWaitValue32`` / ``cuStreamWriteValue32``).
- ``DeviceBuffer``: a device allocation of the judge's own (``cuMemAlloc``: mapping it exposes
  nothing else of the judge's memory), shared through its IPC handle.
- ``Flags``: the GPU's two call words (``SEQ``, ``DONE``) in a page the judge owns.
- ``view``, ``layout_of``, ``dense``, ``contiguous_strides``: tensors laid over shared bytes.
- ``other_work_ms``: whether another process's work holds the device (before a timing run).

Both sides import this module; nothing here decides anything. What one side describes to the other
is checked against what is there (``view``, ``mapped``).
"""

from __future__ import annotations

import ctypes
import fcntl
import math
import mmap
import os
import statistics
import time

import torch

#: A device allocation is at least this large (cuMemAlloc refuses 0 bytes; an empty tensor still needs an address).
_MIN_BYTES = 256
_PAGE = 4096


# ============================================================================ the CPU: memfds


#: The names a call's memfds carry (``/proc/self/fd`` shows them): its inputs, and its outputs' spill buffer.
INPUTS, OUTPUTS = "kernel_env-inputs", "kernel_env-outputs"


def memfd(nbytes: int, name: str) -> int:
    """(The judge.) A new memfd of ``nbytes`` (a page at least), its pages allocated now, its size
    sealed (a worker that shrank it would have the judge's reads of it fault: SIGBUS). Each call gets
    its own: nothing the worker held before the call is ever written with the call's data."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    size = _size(nbytes)
    os.ftruncate(fd, size)
    os.posix_fallocate(fd, 0, size)  # its pages allocated here, outside the call, not by the worker's first writes
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def seal_writes(fd: int) -> bool:
    """(The judge.) Seal the memfd against every write from now on, whoever holds it; False where it
    cannot be sealed: a mapping of it is still writable (the kernel refuses, EBUSY). Once sealed, what
    it holds is final: a thread that would write an output after its ``Done`` cannot."""
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except OSError:
        return False
    return True


def mapped(fd: int, nbytes: int, *, private: bool = False) -> torch.Tensor:
    """The bytes of memfd ``fd`` as a flat uint8 tensor over a mapping of it (its pages mapped now,
    ``MAP_POPULATE``). ``private``: a copy-on-write mapping, whose writes never reach the memfd (the
    judge's reading of a sealed spill buffer). The mapping lives as long as a view of the tensor does.

    Raises:
        ValueError: the memfd holds less than ``nbytes``."""
    size = _size(nbytes)
    if os.fstat(fd).st_size < size:
        raise ValueError("a shared buffer smaller than its description")
    flags = (mmap.MAP_PRIVATE if private else mmap.MAP_SHARED) | getattr(mmap, "MAP_POPULATE", 0)
    return torch.frombuffer(mmap.mmap(fd, size, flags=flags), dtype=torch.uint8, count=size)


def write(fd: int, t: torch.Tensor, offset: int, stride: list[int]) -> None:
    """(The worker.) ``t``'s elements written into memfd ``fd`` at ``offset``, laid out by ``stride`` (a
    dense layout), by ``pwrite``: no mapping of the memfd in this process (mapping, copying into and
    unmapping a fresh 4 MB spill buffer took 1.6 ms on a 2-core VM, a write 0.5)."""
    if not t.numel():
        return
    if list(t.stride()) != list(stride) or not dense(t):
        t = torch.empty_strided(t.shape, stride, dtype=t.dtype).copy_(t)
    nbytes = t.numel() * t.element_size()
    data = memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")  # (dense: it starts there)
    written = 0
    while written < nbytes:
        written += os.pwrite(fd, data[written:], offset + written)


def extent(specs: list) -> int:
    """The bytes a call's memfd needs for tensors laid out by ``specs`` (``BufferSpec``s; None skipped)."""
    return max((x.offset + x.nbytes for x in specs if x is not None), default=0)


def over(raw: torch.Tensor, specs: list) -> list:
    """Tensors over a call's memfd (``raw``, from ``mapped``) as ``specs`` lay them (None stays None)."""
    return [None if x is None else view(raw, getattr(torch, x.dtype), x.shape, x.stride, x.offset) for x in specs]


def _size(nbytes: int) -> int:
    return max(-(-nbytes // _PAGE) * _PAGE, _PAGE)


def view(raw: torch.Tensor, dtype: torch.dtype, shape: list[int], stride: list[int], offset: int = 0) -> torch.Tensor:
    """A tensor over shared bytes, as the other side described it.

    Args:
        raw: the bytes (a flat uint8 tensor).
        dtype, shape, stride: the tensor's, stride in elements.
        offset: where in ``raw`` it starts, in bytes.

    Returns:
        A view of ``raw`` (no copy); an empty tensor where ``shape`` holds no element.

    Raises:
        ValueError: a negative or misaligned size, stride or offset, a shape and a stride of
            different lengths, or a tensor that would reach past the end of ``raw``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(shape) != len(stride) or min([*shape, *stride, offset], default=0) < 0 or offset % itemsize:
        raise ValueError("a negative or misaligned size, stride or offset")
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=raw.device)
    extent = (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * itemsize
    if offset + extent > raw.numel():
        raise ValueError(f"{extent} bytes at offset {offset} reach past the {raw.numel()} bytes there")
    return raw[offset:offset + extent].view(dtype).as_strided(shape, stride)


def layout_of(t: torch.Tensor) -> tuple[list[int], list[int], int]:
    """(shape, stride, bytes) of a dense copy of ``t`` that keeps its strides where they describe a
    layout without gaps or overlaps, else a contiguous one."""
    shape = list(t.shape)
    stride = list(t.stride()) if dense(t) else contiguous_strides(shape)
    return shape, stride, t.numel() * t.element_size()


def contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory exactly: no gap, no element twice (a
    permutation of a contiguous layout)."""
    if t.numel() == 0:
        return True
    step = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1):
        if stride != step:
            return False
        step *= size
    return True


# ============================================================================ the GPU: libcuda


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _CudaArray:
    """The ``__cuda_array_interface__`` of raw device bytes, for ``torch.as_tensor``."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3}


_WAIT_GEQ, _WAIT_EQ = 0x0, 0x1


class DeviceMemory:
    """The CUDA driver calls both sides need (the process's primary context must be current)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = ctypes.CDLL("libcuda.so.1")
        self._wait = self._symbol("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self._write = self._symbol("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self._opened: dict[str, tuple[int, int]] = {}  # handle -> (pointer, size), opened once each

    def _symbol(self, *names: str):
        for name in names:
            if hasattr(self._cuda, name):
                return getattr(self._cuda, name)
        raise OSError(f"this CUDA driver has no {names[0]}")

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self._cuda.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({result})")

    def alloc(self, nbytes: int) -> int:
        pointer = ctypes.c_uint64()
        self._check(self._cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, _MIN_BYTES))), "cuMemAlloc")
        self._check(self._cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(0), ctypes.c_size_t(max(nbytes, _MIN_BYTES))), "cuMemsetD8")
        return pointer.value

    def export(self, pointer: int) -> str | None:
        """The IPC handle of the allocation ``pointer`` starts, hex; None where it cannot be shared
        (memory opened from another process, or from an allocator without IPC)."""
        handle = _IpcHandle()
        if self._cuda.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(pointer)) != 0:
            return None
        return ctypes.string_at(ctypes.addressof(handle), 64).hex()

    def open(self, handle: str) -> tuple[int, int]:
        """(pointer, size) of another process's allocation named by ``handle`` (opened once)."""
        if handle not in self._opened:
            raw = bytes.fromhex(handle)
            if len(raw) != 64:
                raise ValueError("an IPC handle of the wrong length")
            native = _IpcHandle()
            ctypes.memmove(ctypes.addressof(native), raw, 64)
            pointer = ctypes.c_uint64()
            self._check(self._cuda.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), native, ctypes.c_uint(1)), "cuIpcOpenMemHandle")
            self._opened[handle] = (pointer.value, self.extent(pointer.value)[1])
        return self._opened[handle]

    def close(self, handle: str) -> None:
        """Unmap another process's allocation opened by ``handle`` (its memory is freed once its owner
        has freed it too)."""
        opened = self._opened.pop(handle, None)
        if opened is not None:
            self._check(self._cuda.cuIpcCloseMemHandle(ctypes.c_uint64(opened[0])), "cuIpcCloseMemHandle")

    def free(self, pointer: int) -> None:
        self._check(self._cuda.cuMemFree_v2(ctypes.c_uint64(pointer)), "cuMemFree")

    def extent(self, pointer: int) -> tuple[int, int]:
        """(base, size) of the allocation ``pointer`` lies in."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(self._cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer)),
                    "cuMemGetAddressRange")
        return base.value, size.value

    def bytes_at(self, pointer: int, nbytes: int) -> torch.Tensor:
        """The device bytes [pointer, pointer + nbytes) as a uint8 tensor (no copy)."""
        return torch.as_tensor(_CudaArray(pointer, max(nbytes, 1)), device=self.device)[:nbytes]

    def host_pointer(self, tensor: torch.Tensor) -> int:
        """The device's address of pinned host memory (``tensor``, pinned)."""
        pointer = ctypes.c_uint64()
        self._check(self._cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(pointer), ctypes.c_void_p(tensor.data_ptr()),
                                                            ctypes.c_uint(0)), "cuMemHostGetDevicePointer")
        return pointer.value

    def wait_value(self, stream: torch.cuda.Stream, address: int, value: int, *, equal: bool = False) -> None:
        """``stream`` waits until the word at ``address`` is >= ``value`` (== with ``equal``)."""
        self._check(self._wait(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(address), ctypes.c_uint32(value),
                               ctypes.c_uint(_WAIT_EQ if equal else _WAIT_GEQ)), "cuStreamWaitValue32")

    def write_value(self, stream: torch.cuda.Stream, address: int, value: int) -> None:
        """``stream`` writes ``value`` to the word at ``address`` once its earlier work is done."""
        self._check(self._write(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(address), ctypes.c_uint32(value),
                                ctypes.c_uint(0)), "cuStreamWriteValue32")


class DeviceBuffer:
    """A device allocation of the judge's own, shared with the worker (``handle``)."""

    def __init__(self, memory: DeviceMemory, nbytes: int):
        self.nbytes = nbytes
        self.pointer = memory.alloc(nbytes)
        self.handle = memory.export(self.pointer)
        if self.handle is None:
            raise RuntimeError("a device allocation of the judge's own could not be shared (CUDA IPC)")
        self.raw = memory.bytes_at(self.pointer, max(nbytes, _MIN_BYTES))

    def tensor(self, dtype: torch.dtype, shape: list[int], stride: list[int]) -> torch.Tensor:
        return view(self.raw, dtype, shape, stride)

    def free(self, memory: DeviceMemory) -> None:
        """Free the allocation (no view of it may be used after)."""
        self.raw = None
        memory.free(self.pointer)


#: Offsets of the two words in the flags page.
SEQ, DONE = 0, 4


class Flags:
    """The GPU's call flags: ``SEQ`` (the call's number, which the worker's stream waits for) and
    ``DONE`` (where the worker's stream writes the number once its work is done). Both are written by
    stream memory operations (``cuStreamWriteValue32``), never by a kernel: a kernel's write of the
    done word put the judge's wake-up in one of two modes 7 us apart on an H200, in shares that
    changed from run to run (docs/design.md, One call, and the clock). The judge allocates the
    page; the worker opens it by ``handle``."""

    def __init__(self, memory: DeviceMemory, handle: str | None = None):
        self.memory = memory
        if handle is None:
            self.base = memory.alloc(_PAGE)
            self.handle = memory.export(self.base)
        else:
            self.base, size = memory.open(handle)
            if size < 8:
                raise ValueError("a flags page too small")
            self.handle = handle

    def done(self, stream: torch.cuda.Stream, k: int) -> None:
        """(The worker.) ``stream`` writes call ``k``'s number to the done word once its work is done."""
        self.memory.write_value(stream, self.base + DONE, k)


#: A tiny kernel's launch and completion takes ~20 us on an idle H100; a device time-shared with
#: another process's running kernel makes it wait for that process's time slice (milliseconds).
_BUSY_MS = 0.5


def other_work_ms(device: torch.device, rounds: int = 5) -> float | None:
    """Milliseconds a tiny kernel waited to run and finish (median of ``rounds``) when another
    process's work holds the device, else None: before a timing run on a device shared with
    other jobs, whose processes are frozen but whose kernels already launched run on."""
    if device.type != "cuda":
        return None
    probe = torch.zeros(1, device=device)
    walls = []
    for _ in range(rounds):
        began = time.perf_counter_ns()
        probe.add_(1)
        torch.cuda.synchronize(device)
        walls.append((time.perf_counter_ns() - began) / 1e6)
    wall = statistics.median(walls)
    return wall if wall > _BUSY_MS else None
