"""Every message that crosses an evaluation process's boundary, typed; the standard library only.

Two conversations, both of them here:

- **harness -> child** (any role): a command (``Setup``, ``RefTrials``, ``Drive``, ``Load``, ...) as a
  JSON line on the child's stdin; the child answers with a ``Reply`` on its reply pipe, signed
  (``sign``) under a key the harness sends as the child's first line. The harness reads an answer
  with ``decode`` into the command's answer class, which checks every field's type: the worker's
  answers come from a process that runs candidate code.
- **judge <-> worker** (the call protocol, ``judge.py`` and ``worker.py``), on a socket of their
  own that the harness hands each of them (``Connect``): the judge sends ``Buffers`` (how a
  layout's inputs and spill outputs lie), ``Flags`` (the GPU's call number and done words), one
  ``Go`` per call and ``Stop`` after a phase's calls; the worker answers each ``Go`` with a ``Done``
  naming where its outputs are, then ``Settled``. On the CPU a ``Go`` carries the call's own inputs
  memfd, and between the two the worker says ``Ready`` (its forward has returned) and the judge
  answers ``Spill`` (the call's own spill memfd). Nothing the worker sends is trusted: a ``Done``
  only says where to look, and the judge reads and judges the memory itself.

Both sides import this module: the children as ``protocol`` (a sibling), the host as
``kernel_env.evaluators.child.protocol``. It never imports torch.

Why one module: a message is read field by field on the side that did not write it, so the two
conversations' records and their one decoder live together, where a reader checking what a
process can say across the boundary sees all of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

try:
    from _hashlib import hmac_digest as _hmac_digest  # C: nothing the code under test patches reaches it
except ImportError:  # Python built without OpenSSL
    from hmac import digest as _hmac_digest

#: The largest message either side reads from the other (a ``Done``, a ``Reply``).
MAX_MESSAGE = 4 << 20
#: The file in the judge's job folder (``Setup.out_dir``) whose lock the judge holds through each call with
#: its worker on a GPU, and another job's timing run takes to pause its calls (evaluators/sharing.py).
CALLS_LOCK = "calls.lock"
#: Beside it, the gate the judge passes (a shared lock, let go once it holds ``CALLS_LOCK``) before each call,
#: and that timing run holds first: the judge starts no call while the run waits for the one in flight, so the
#: run waits for one call at most, never for a gap in a step's back-to-back calls.
CALLS_GATE = "calls.gate"
#: Bumped whenever a change to the judge's clock changes what a timing means; part of the baseline cache key.
PROTOCOL_VERSION = 10
_json_dumps, _json_loads = json.dumps, json.loads


class ProtocolError(ValueError):
    """A message that is not what the protocol says (malformed, of the wrong type, too long)."""


@dataclass
class Message:
    """Base of every message: ``encode`` writes it as JSON with its type's name."""

    def encode(self) -> bytes:
        return _json_dumps({"type": type(self).__name__, **dataclasses.asdict(self)}).encode()


# ============================================================================ harness -> child


@dataclass
class Setup(Message):
    """Load the task (``task_code``) on ``device``; ``out_dir`` is the child's writable job folder."""
    device: str
    out_dir: str
    task_code: str
    pid_namespace: bool = False  # the child is alone in a pid namespace: /proc lists only its processes


@dataclass
class SetupAnswer(Message):
    device_name: str
    torch: str


@dataclass
class Connect(Message):
    """Take the judge–worker socket the harness has just sent on the child's parent socket."""


@dataclass
class RefInit(Message):
    """The judge builds the reference Model under ``init_seed`` and saves its weights and init inputs."""
    init_seed: int


@dataclass
class ReferenceTrial(Message):
    variant: str
    mutated_inputs: bool
    non_tensor_outputs: list[str]


@dataclass
class RefTrials(Message):
    """The judge runs the reference on each trial's inputs and keeps the outputs (``screen`` varies
    them). ``screen``: look for the trivial answers that pass them all (the host asks once per task)."""
    seeds: list[int]
    vary: bool
    atol: float
    rtol: float
    screen: bool = True


@dataclass
class RefTrialsAnswer(Message):
    trials: list[ReferenceTrial] = field(default_factory=list)
    trivial: list[str] = field(default_factory=list)
    #: The bytes a timed call must move: its tensor inputs read and its outputs written, each counted
    #: by its distinct elements (an expanded tensor's once), on the task's own inputs (the physical floor).
    call_bytes: int = 0
    error: str | None = None


@dataclass
class RefScreen(Message):
    """Facts about the task for the synthesis filter (``runner.Runner.ref_screen``)."""
    seeds: list[int]
    compile: bool = False


@dataclass
class RefTime(Message):
    """The task's Model (``eager``) and ``torch.compile`` of it (``compile``) timed in the judge's own
    process, as ``do_bench`` times a callable: fresh inputs, the caches flushed, device events around
    the forward (``Reference.time``). With several models, their calls alternate, so a change of the
    machine's pace lands on each alike. ``calls=0``: only the warm-up (torch.compile compiles there).
    The baselines' times, and the synthesis filter's bounds on a task."""
    calls: int
    warmup: int
    flush_bytes: int
    models: list[Literal["eager", "compile"]] = field(default_factory=lambda: ["eager"])


@dataclass
class RefTimeAnswer(Message):
    times_ms: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class RefBandwidth(Message):
    """The device's memory bandwidth, measured in the judge's own process (``bandwidth.best``): the
    physical floor's divisor, measured once per device and cached by the harness."""
    flush_bytes: int


@dataclass
class BandwidthAnswer(Message):
    bytes_per_ms: float


@dataclass
class DeviceProbe(Message):
    """How long another process's work holds the device (``exchange.other_work_ms``)."""


@dataclass
class ProbeAnswer(Message):
    busy_ms: float | None = None


Phase = Literal["trials", "warmup", "time"]


@dataclass
class Drive(Message):
    """The judge drives the connected worker through calls (``judge.Judge.drive``).

    ``trials``: the reference's trials, compared in full. ``warmup``: ``calls`` calls, neither
    judged nor timed. ``time``: ``calls`` timed calls, ``checked`` of them (which ones is secret; a
    candidate's: all) compared in full, after (on a GPU) as many calls of the task's Model in the
    judge's own process (``local``); ``own_share`` (the CPU, the yardstick's run only): before each
    timed call, the judge's own share of a call (``share``: the same steps with no worker)."""
    phase: Phase
    calls: int = 0
    checked: int = 0
    # The job's tolerance (EvalSettings), sent by the harness with every phase that compares; the
    # protocol keeps no default of its own to drift from it (exact, were a phase sent without it).
    atol: float = 0.0
    rtol: float = 0.0
    flush_bytes: int = 0
    own_share: bool = False


@dataclass
class Findings(Message):
    """What the worker's own checks saw during a call of a candidate's (every one is audited): reasons to
    lower a reward, never to raise it."""
    torch_ops: dict[str, int] = field(default_factory=dict)
    triton_launches: int = 0
    empty_output: bool = False
    audited: bool = False  # the call ran under the dispatch audit and the launch count


@dataclass
class TrialVerdict(Message):
    """The judge's comparison of one call's outputs with the reference's (``compare.TrialReport``)."""
    trial: int
    correct: bool
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_bad_index: list[int] | None = None
    # The precision contract (``precision.py``), on the calls it checks: the output's relative error
    # against the Model in float64, the task's own code's, the limit above which it is refused; or
    # why the call was not checked.
    float64_error: float | None = None
    eager_float64_error: float | None = None
    float64_error_limit: float | None = None
    precision_note: str | None = None


@dataclass
class CallRecord(Message):
    """One call, as the judge saw it: its verdict (None where unchecked), its time on the judge's
    clock, the whole call (None where untimed), and the worker's findings. A ``local`` call is the
    task's Model in the judge's own process (``RefTime``'s way), made before a run's timed calls; a
    ``share`` call the judge's own share of a call on the CPU (``Drive.own_share``)."""
    k: int
    kind: str  # "trial", "warmup", "timed", "local", "share"
    verdict: TrialVerdict | None = None
    time_ms: float | None = None
    mutated_inputs: bool = False
    findings: Findings | None = None


@dataclass
class DriveAnswer(Message):
    calls: list[CallRecord] = field(default_factory=list)
    #: Why the calls stopped early: the worker broke the protocol, ended, or raised (its words, quoted).
    error: str | None = None
    #: The worker's own error (an exception in forward), as it reported it.
    worker_error: str | None = None


@dataclass
class Serve(Message):
    """The worker serves the judge's calls until the judge says ``Stop``."""


@dataclass
class ServeAnswer(Message):
    """How many calls the worker answered, and what it saw beside them after each (new processes and
    threads, modes left on torch's stack): reasons to lower a reward, never to raise it."""
    calls: int = 0
    processes: list[str] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)


ModelKind = Literal["candidate", "eager", "compile"]


@dataclass
class Load(Message):
    """The worker builds the model it will run: the candidate's ModelNew from ``snapshot``, or the
    task's Model (``eager``) or ``torch.compile`` of it, with the reference's weights."""
    kind: ModelKind
    init_inputs: str
    state_dict: str
    init_seed: int
    snapshot: str = ""
    language: str = ""


@dataclass
class LoadAnswer(Message):
    error: str | None = None
    loaded_weights: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    missing_weights: list[str] = field(default_factory=list)


@dataclass
class Integrity(Message):
    """What the candidate changed in the worker's process: replaced harness objects, threads, processes, modes."""


@dataclass
class IntegrityAnswer(Message):
    changes: list[str] = field(default_factory=list)
    new_threads: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)


@dataclass
class Reply(Message):
    """A child's answer to a command: ``body`` is the command's answer class's fields."""
    ok: bool
    body: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    kind: str | None = None


COMMANDS: dict[str, type[Message]] = {cls.__name__: cls for cls in (
    Setup, Connect, RefInit, RefTrials, RefScreen, RefTime, RefBandwidth, DeviceProbe, Drive, Serve, Load, Integrity)}


# ============================================================================ judge <-> worker


@dataclass
class BufferSpec(Message):
    """One tensor in shared memory: its layout, and where it lives (``handle``: a CUDA IPC memory
    handle, hex, of an allocation of ``nbytes``; on the CPU ``offset``: where the tensor starts in
    each call's memfd, the inputs' or the spill buffer's)."""
    dtype: str
    shape: list[int]
    stride: list[int]
    nbytes: int
    handle: str | None = None
    offset: int = 0


@dataclass
class Buffers(Message):
    """Layout ``layout``: a call's inputs (tensors in order; other inputs go with each ``Go``) and the
    buffers the worker copies outputs it cannot share into (``spill``)."""
    layout: int
    inputs: list[BufferSpec | None]  # None: a non-tensor input, given with each Go
    spill: list[BufferSpec]


@dataclass
class Release(Message):
    """(GPU.) The judge no longer uses these layouts: the worker closes its mappings of their buffers
    and answers ``Released``; then the judge frees them (a big task's layouts would hold the device)."""
    layouts: list[int]


@dataclass
class Released(Message):
    """The worker's answer to ``Release``."""


@dataclass
class Flags(Message):
    """The GPU's call flags (``exchange.Flags``): a page the judge allocated, as an IPC handle."""
    handle: str


@dataclass
class Go(Message):
    """Call ``k`` on layout ``layout``'s inputs (on the CPU in the memfd sent with it, made for this
    call alone). ``values``: the non-tensor inputs (None where a tensor goes). Nothing in it tells one
    kind of call from another: a candidate's calls all run under every check."""
    k: int
    layout: int
    values: list[Any] = field(default_factory=list)


@dataclass
class Ready(Message):
    """(The CPU, the worker.) Call ``k``'s forward has returned: the judge sends its spill buffer."""
    k: int


@dataclass
class Spill(Message):
    """(The CPU, the judge.) Call ``k``'s spill buffer, a memfd made for this call alone, sent with this
    message only once the forward has returned (an output cannot have been computed into it); the judge
    seals it against writes when the ``Done`` comes, and reads it then."""
    k: int


@dataclass
class OutputRef(Message):
    """Where one output of a call is: in the worker's own device memory (``handle`` of its
    allocation and ``offset`` in bytes from its start), or copied into the judge's spill buffer
    (``spilled``). The layout is what the worker says; the judge reads it and judges the values."""
    dtype: str
    shape: list[int]
    stride: list[int]
    offset: int = 0
    handle: str | None = None
    spilled: bool = False


@dataclass
class Done(Message):
    """The worker's answer to ``Go`` ``k``: its work for the call is queued (GPU) or finished (CPU)."""
    k: int
    outputs: list[OutputRef] = field(default_factory=list)
    sequence: bool = False
    error: str | None = None  # forward raised, or returned something that is not plain tensors
    findings: Findings | None = None


@dataclass
class Settled(Message):
    """(The worker, after each ``Done`` and a look around, outside the judge's clock.) It waits for the next
    call; on a GPU its device has finished the call's work, or failed it (``error``: a fault in its
    kernels, which the judge's stream would otherwise wait for forever)."""
    k: int
    error: str | None = None


@dataclass
class Stop(Message):
    """No more calls."""


# ============================================================================ encoding


def decode(data: bytes | str | dict, expected: type[Message] | tuple[type[Message], ...]) -> Message:
    """The message ``data`` holds, checked field by field against its class; ProtocolError for
    anything else (another type than ``expected``, a missing or mistyped field, a long message)."""
    if isinstance(data, (bytes, str)):
        if len(data) > MAX_MESSAGE:
            raise ProtocolError(f"a message of {len(data)} bytes (at most {MAX_MESSAGE})")
        try:
            data = _json_loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ProtocolError("a message that is not JSON (or nested too deep)") from None
    classes = expected if isinstance(expected, tuple) else (expected,)
    if not isinstance(data, dict):
        raise ProtocolError("a message that is not an object")
    name = data.get("type", classes[0].__name__)
    cls = next((c for c in classes if c.__name__ == name), None)
    if cls is None:
        raise ProtocolError(f"a {str(name)[:40]!r} message where {'/'.join(c.__name__ for c in classes)} was expected")
    try:
        return _build(cls, data, cls.__name__)
    except RecursionError:
        raise ProtocolError("a message nested too deep") from None


def body(answer: Message) -> dict:
    """An answer's fields, for ``Reply.body``."""
    return dataclasses.asdict(answer)


_HINTS: dict[type, dict] = {}


def _build(cls: type, data: dict, where: str):
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    values = {}
    for item in dataclasses.fields(cls):
        if item.name in data:
            values[item.name] = _check(hints[item.name], data[item.name], f"{where}.{item.name}")
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where} has no {item.name}")
    return cls(**values)


def _check(hint, value, where: str):
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _check(option, value, where)
            except ProtocolError:
                continue
        raise ProtocolError(f"{where}: {type(value).__name__} is none of {hint}")
    if origin is Literal:
        if value in typing.get_args(hint):
            return value
        raise ProtocolError(f"{where}: {str(value)[:40]!r} is not one of {typing.get_args(hint)}")
    if hint is type(None):
        if value is None:
            return None
    elif origin is list:
        if isinstance(value, list):
            (item,) = typing.get_args(hint)
            return [_check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            key, item = typing.get_args(hint)
            return {_check(key, k, where): _check(item, v, f"{where}[{k!r}]") for k, v in value.items()}
    elif isinstance(hint, type) and issubclass(hint, Message):
        if isinstance(value, dict):
            return _build(hint, value, where)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint in (str, bool):
        if type(value) is hint:
            return value
    raise ProtocolError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")


def sign(key: bytes, text: str) -> str:
    """The signature a child's answer line carries (``text<TAB>sign(key, text)``)."""
    return _hmac_digest(key, text.encode(), "sha256").hex()[:32]


# ============================================================================ the judge–worker socket


class Link:
    """One end of the judge–worker socket (``SOCK_SEQPACKET``: one message a packet). ``accept_fds``:
    whether descriptors sent with a message are kept (the worker takes the judge's memfds); the judge
    takes none, and closes whatever the worker sends along."""

    def __init__(self, sock, *, accept_fds: bool):
        self.sock = sock
        self.accept_fds = accept_fds

    def send(self, message: Message, fds: list[int] = ()) -> None:
        data = message.encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv(self, expected: type[Message] | tuple[type[Message], ...], timeout: float | None = None) -> tuple[Message, list[int]]:
        """The next message, decoded (ProtocolError if it is not one of ``expected``), and the
        descriptors that came with it. EOFError once the other side has closed the socket;
        TimeoutError after ``timeout`` seconds without one."""
        self.sock.settimeout(timeout)
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 16 if self.accept_fds else 1)
        except TimeoutError:
            raise
        except OSError as exc:
            raise EOFError(f"the socket broke ({exc})") from None
        finally:
            self.sock.settimeout(None)
        if not self.accept_fds:
            for fd in fds:
                os.close(fd)
            fds = []
        if not data:
            raise EOFError("the other side closed the socket")
        return decode(data, expected), fds
