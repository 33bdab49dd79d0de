"""An evaluation child's main loop: role ``judge`` (the reference's process, trusted) or ``worker``
(the model under test, untrusted).

Forked by the fork server (``zygote.py``, which imported this module with torch, Triton and the
siblings) into an isolated process, which runs ``main(role)``. Its first stdin line is the key its
answers are signed with (``protocol.sign``); then each line is a command (``protocol.COMMANDS``),
answered with a ``protocol.Reply`` on the reply descriptor (``KE_REPLY_FD``). stdout and stderr
belong to the code under test and are only logged. The harness hands the judge and the worker
the two ends of a socket of their own on each child's parent socket (``KE_PARENT_FD``): the calls
go over it, never through the harness (``judge.py``, ``worker.py``).

The command table and the way to answer are bound before any code under test is imported: a
method the candidate replaces later is not the one that runs (and the worker's integrity check
names the replacement).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bandwidth  # noqa: E402
import exchange  # noqa: E402
import judge  # noqa: E402
import protocol  # noqa: E402
import worker  # noqa: E402
from protocol import (  # noqa: E402
    BandwidthAnswer,
    Connect,
    DeviceProbe,
    Drive,
    Integrity,
    Load,
    ProbeAnswer,
    RefBandwidth,
    RefInit,
    RefScreen,
    RefTime,
    RefTimeAnswer,
    RefTrials,
    Reply,
    Serve,
    Setup,
    SetupAnswer,
)
from reference import Reference  # noqa: E402

_json_dumps, _sign = json.dumps, protocol.sign


class Channel:
    """The child's way to the harness: answers on the reply pipe, signed with the key the harness
    sent first (a candidate writing to the pipe itself forges nothing the harness accepts, short of
    finding this object); descriptors from the harness on the parent socket."""

    def __init__(self, key: bytes):
        self._key = key
        self._reply = os.fdopen(os.dup(int(os.environ.get("KE_REPLY_FD", "1"))), "w", buffering=1)
        parent = os.environ.get("KE_PARENT_FD")
        self._parent = socket.socket(fileno=int(parent)) if parent else None

    def reply(self, reply: Reply) -> None:
        text = reply.encode().decode()
        self._reply.write(f"{text}\t{_sign(self._key, text)}\n")
        self._reply.flush()

    def peer(self) -> socket.socket:
        """The judge–worker socket the harness has sent (``Connect``)."""
        if self._parent is None:
            raise RuntimeError("this child has no parent socket to receive its peer on")
        self._parent.settimeout(60)
        _, fds, _, _ = socket.recv_fds(self._parent, 64, 1)
        if len(fds) != 1:
            raise RuntimeError("the harness sent no socket")
        return socket.socket(fileno=fds[0])


class Runner:
    """One child's state: the task, and the judge's or the worker's objects."""

    def __init__(self, role: str, channel: Channel):
        self.role, self.channel = role, channel
        self.device = torch.device("cpu")
        self.reference: Reference | None = None
        self.judge: judge.Judge | None = None
        self.worker: worker.Worker | None = None

    def setup(self, req: Setup) -> SetupAnswer:
        self.device = torch.device(req.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        task: dict = {"__name__": "kernelbench_task"}
        exec(compile(req.task_code, "model.py", "exec"), task)
        if self.role == "judge":
            self.reference = Reference(self.device, task, Path(req.out_dir))
            self.judge = judge.Judge(self.reference)
        else:
            self.worker = worker.Worker(self.device, task, pid_namespace=req.pid_namespace)
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return SetupAnswer(device_name=name, torch=torch.__version__)

    def connect(self, req: Connect) -> None:
        link = protocol.Link(self.channel.peer(), accept_fds=self.role == "worker")
        (self.judge or self.worker).connect(link)

    # the judge's commands
    def ref_init(self, req: RefInit) -> None:
        self.reference.init(req.init_seed)

    def ref_trials(self, req: RefTrials):
        return self.reference.run_trials(req)

    def ref_screen(self, req: RefScreen) -> dict:
        return self.reference.screen(req.seeds, req.compile)

    def ref_time(self, req: RefTime) -> RefTimeAnswer:
        return RefTimeAnswer(times_ms=self.reference.time(req.calls, req.warmup, req.flush_bytes, req.models))

    def ref_bandwidth(self, req: RefBandwidth) -> BandwidthAnswer:
        return BandwidthAnswer(bytes_per_ms=bandwidth.best(self.device, req.flush_bytes, self.reference.threads))

    def device_probe(self, req: DeviceProbe) -> ProbeAnswer:
        return ProbeAnswer(busy_ms=exchange.other_work_ms(self.device))

    def drive(self, req: Drive):
        return self.judge.drive(req)

    # the worker's commands (its methods as they were before any candidate code was imported)
    def load(self, req: Load):
        return _WORKER_LOAD(self.worker, req)

    def serve(self, req: Serve):
        return _WORKER_SERVE(self.worker)

    def integrity(self, req: Integrity):
        return _WORKER_INTEGRITY(self.worker)

    def settle(self) -> None:
        """Wait until the device has done everything this process launched: a command's work ends
        with its answer, so a job sharing the device can start timing once the steps in flight have
        answered (sharing.py). Not a judge whose stream was left waiting for a worker that failed mid-call
        (``Judge.stuck``): it would wait forever, and the job ends with its answer."""
        if self.device.type == "cuda" and not (self.judge is not None and self.judge.stuck):
            torch.cuda.synchronize(self.device)


_WORKER_LOAD, _WORKER_SERVE, _WORKER_INTEGRITY = worker.Worker.load, worker.Worker.serve, worker.Worker.integrity_report

#: Which role may run which command.
_ROLE_COMMANDS = {
    "judge": {"Setup": Runner.setup, "Connect": Runner.connect, "RefInit": Runner.ref_init, "RefTrials": Runner.ref_trials,
              "RefScreen": Runner.ref_screen, "RefTime": Runner.ref_time,
              "RefBandwidth": Runner.ref_bandwidth, "DeviceProbe": Runner.device_probe,
              "Drive": Runner.drive},
    "worker": {"Setup": Runner.setup, "Connect": Runner.connect, "Load": Runner.load, "Serve": Runner.serve,
               "Integrity": Runner.integrity},
}


def preload(role: str) -> None:
    """A spare's work before any job (``children.Spares``): its CUDA context, made (about 0.5 GB of
    the GPU's memory, and a few hundred milliseconds a job does not wait for), and a judge's the
    kernels its calls queue behind their gate (``judge.load_gated_kernels``: 0.1 s a job)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
        try:
            torch.zeros(1, device="cuda")
            if role == "judge":
                judge.load_gated_kernels(torch.device("cuda"), judge.COMMON_DTYPES)
        except Exception:  # noqa: BLE001 - the job meets (and reports) it in its own time
            pass


def main(role: str) -> None:
    channel = Channel(bytes.fromhex(sys.stdin.readline().strip()))
    runner = Runner(role, channel)
    # Bound before any code under test is imported (see the module's docstring).
    commands, classes = dict(_ROLE_COMMANDS[role]), dict(protocol.COMMANDS)
    settle, reply, body, decode = Runner.settle, channel.reply, protocol.body, protocol.decode
    for line in sys.stdin:
        name = "?"
        try:
            data = json.loads(line)
            name = str(data.get("type"))
            handler = commands.get(name)
            if handler is None:
                raise ValueError(f"the {role} process has no command {name[:40]!r}")
            answer = handler(runner, decode(data, classes[name]))
            settle(runner)
            reply(Reply(ok=True, body=body(answer) if isinstance(answer, protocol.Message) else (answer or {})))
        except BaseException as exc:  # the child's job is to report, the harness decides
            reply(Reply(ok=False, error=worker.trimmed(name, exc), kind=type(exc).__name__))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
