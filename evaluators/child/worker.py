"""The worker: the process that runs the model under test (a candidate's ModelNew, or the task's
Model for the eager and torch.compile baselines), and nothing it says is trusted.

It maps the buffers the judge shares (``exchange``), and for each ``Go`` runs the model on the
call's inputs and answers ``Done``: where its outputs are. On a GPU it queues the call behind a
wait for the call's number and answers as soon as it is queued, so its launches are done before
the judge's clock starts; its stream writes the number to the done word after the forward, which
is how the judge learns the work is over. On the CPU the call's inputs come in a memfd of their own
with the ``Go``, and its spill buffer in another once the forward has returned (``Ready``, ``Spill``):
it writes the outputs there (``pwrite``), and answers. The judge reads the outputs and keeps the time
(``judge.py``); so a candidate that reaches every object here, the channel and the flags included,
can at worst be judged on the work it really did, at the speed it really ran.

What runs here besides the model is defence in depth, whose findings can only add violations:
the dispatch audit and Triton launch count of every call of a candidate's (never only some: a call
the audit skipped could be told from the rest), modes left on torch's stack, threads and processes
beside the model, and the integrity of the harness's objects (``guards``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pickle
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

import exchange
import guards
import protocol
from outputs import describe, flatten, is_plain, is_sequence
from protocol import (
    Buffers,
    Done,
    Findings,
    Flags,
    Go,
    Load,
    LoadAnswer,
    OutputRef,
    Release,
    Ready,
    Released,
    ServeAnswer,
    Settled,
    Spill,
    Stop,
)


class _Layout:
    """A layout's inputs and spill outputs: on a GPU tensors over the judge's buffers (opened by
    ``handles``); on the CPU their specs, laid over each call's own memfds."""

    def __init__(self, inputs: list, spill: list, handles: list[str], input_specs: list = (), spill_specs: list = ()):
        self.inputs, self.spill, self.handles = inputs, spill, handles
        self.input_specs, self.spill_specs = list(input_specs), list(spill_specs)
        self.input_bytes, self.spill_bytes = exchange.extent(self.input_specs), exchange.extent(self.spill_specs)


class _Ops(NamedTuple):
    map: Callable
    release: Callable
    call: Callable
    share: Callable
    spill: Callable
    copy_out: Callable
    audited: Callable
    look_around: Callable
    settle: Callable


class Worker:
    def __init__(self, device: torch.device, task: dict, *, pid_namespace: bool):
        self.device = device
        self.cuda = device.type == "cuda"
        self.task = task
        self.memory = exchange.DeviceMemory(device) if self.cuda else None
        self.pid_namespace = pid_namespace
        # Set once each (``connect``, ``load``); what changes from call to call lives in these containers.
        self.link: protocol.Link | None = None
        self.model = None
        self.flags: list[exchange.Flags] = []
        self.layouts: dict[int, _Layout] = {}
        self.kept: list = []  # the last call's outputs, alive until the judge has read them
        self.seen = {"calls": 0, "processes": set(), "threads": set(), "modes": set()}
        self.audit = False  # a candidate's calls, every one of them, run under the audit (``load``)
        self.launches = guards.KernelLaunchCounter()
        self.integrity: guards.Integrity | None = None
        self.processes: guards.Processes | None = None
        # The methods a call runs, bound now, before any candidate code exists in the process: a method
        # the candidate replaces on the class later is not the one that runs (the integrity check names it).
        self.ops = _Ops(Worker._map, Worker._release, Worker._call, Worker._share, Worker._spill, _copy_out,
                        Worker._audited, Worker._look_around, Worker._settle)

    def connect(self, link: protocol.Link) -> None:
        self.link = link

    # ------------------------------------------------------------------ the model

    def load(self, req: Load) -> LoadAnswer:
        """The model this worker runs: the candidate's ModelNew, or the task's Model (``eager``) or
        ``torch.compile`` of it; with the reference's weights (matched by name)."""
        if req.kind == "candidate":
            # Every check, bound and snapshotted before any candidate code is imported.
            self.launches.install()
            guards.watch_host_reads()
            self.processes = guards.Processes() if self.pid_namespace else None
            self.audit = True
            self.integrity = guards.Integrity(instances={"the worker": self, "the worker's link": self.link})
            self.integrity.accept("the worker", "integrity")
        init = _init_inputs(req.init_inputs)
        if init is None:
            # Values only a full unpickling rebuilds (a class, a range), or none could be saved: made here as
            # the reference made them (the same code and seed; no candidate code has run in this process yet).
            torch.manual_seed(req.init_seed)
            init = self.task["get_init_inputs"]()
        reference_state = torch.load(req.state_dict, weights_only=True)
        if req.kind == "candidate":
            built = self._candidate(Path(req.snapshot), init, req.init_seed)
            if isinstance(built, str):
                return LoadAnswer(error=built)
            model = built
        else:
            torch.manual_seed(req.init_seed)
            model = self.task["Model"](*init)
        own = model.state_dict()
        matched = {k: v for k, v in reference_state.items() if k in own and own[k].shape == v.shape}
        mismatched = sorted(k for k, v in reference_state.items() if k in own and own[k].shape != v.shape)
        model.load_state_dict(matched, strict=False)
        model = model.to(self.device).eval()
        self.model = torch.compile(model) if req.kind == "compile" else model
        if self.integrity is not None:
            self.integrity.accept("the worker", "model")
        if self.cuda:
            fault = self._first_forward()
            if fault is not None:
                return LoadAnswer(error=fault)
        return LoadAnswer(loaded_weights=sorted(matched), shape_mismatch=mismatched,
                          missing_weights=sorted(k for k in reference_state if k not in own))

    def _first_forward(self) -> str | None:
        """(A GPU.) The model's first forward, on inputs this process draws itself (the task's
        ``get_inputs()``, on a seed of its own), before any call. A first forward does what no later
        one does: Triton compiles its kernels (or an autotuner times its configurations), torch.compile
        traces, a library makes its handles. Inside the judge's first call that work would hold the
        judge's calls lock (protocol.CALLS_LOCK) for as long, and every other job's timing run on the
        device would wait for it; here it is part of this untimed step. Nothing of it is judged or
        kept: the trials decide, and a forward that fails here fails there with its own message.
        Returns None, or the error where the device faulted (this process's context is lost)."""
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        inputs = None
        try:
            with torch.device(self.device):
                inputs = self.task["get_inputs"]()
            inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                if self.audit:  # under the audit, as every call of a candidate's runs
                    self.ops.audited(self, inputs)
                else:
                    self.model(*inputs)
        except BaseException:  # the trials meet it again, and report it
            pass
        del inputs
        try:
            torch.cuda.synchronize(self.device)
        except BaseException as exc:
            model = "ModelNew" if self.audit else "the task's Model"
            return trimmed(f"{model}.forward (on the device, a first call before any of the judge's)", exc)
        torch.cuda.empty_cache()  # its inputs and outputs: the device's again, for the judge's call buffers
        return None

    def _candidate(self, snapshot: Path, init: list, init_seed: int):
        """ModelNew built from the snapshot, or why not (a string)."""
        sys.path.insert(0, str(snapshot))
        sys.path.insert(0, str(snapshot / "build"))
        spec = importlib.util.spec_from_file_location("model_new", snapshot / "model_new.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["model_new"] = module
        try:
            if (snapshot / "kernels").is_dir():
                _bind_package("kernels", snapshot / "kernels")
            spec.loader.exec_module(module)
        except Exception as exc:
            error = trimmed("importing model_new.py", exc)
            if "undefined symbol" in str(exc):
                error += (f"\n(this worker runs torch {torch.__version__}: was build/ built against another torch? "
                          "Run `bash utils/compile.sh` again.)")
            return error
        if not hasattr(module, "ModelNew"):
            return "model_new.py does not define ModelNew"
        torch.manual_seed(init_seed)
        try:
            model = module.ModelNew(*init)
        except Exception as exc:
            return trimmed("ModelNew(*get_init_inputs())", exc)
        if not isinstance(model, torch.nn.Module):
            return "ModelNew(...) is not a torch.nn.Module"
        return model

    # ------------------------------------------------------------------ the calls

    def serve(self) -> ServeAnswer:
        """Answer the judge's calls until it says ``Stop``; then what was seen beside them. Whatever
        stops it otherwise closes its end of the socket: the judge must not wait for a ``Done`` that
        will never come."""
        try:
            return self._serve()
        except BaseException:
            self.link.sock.close()
            raise

    def _serve(self) -> ServeAnswer:
        while True:
            message, fds = self.link.recv((Buffers, Flags, Go, Release, Stop))
            if isinstance(message, Stop):
                break
            if isinstance(message, Flags):
                self.flags[:] = [exchange.Flags(self.memory, message.handle)]
            elif isinstance(message, Buffers):
                self.ops.map(self, message, fds)
            elif isinstance(message, Release):
                self.ops.release(self, message)
                self.link.send(Released())
            else:
                self.link.send(self.ops.call(self, message, fds))
                # Then, outside the judge's clock: the device done with the call (or failed), a look around,
                # and word that this process waits for the next call (the judge starts none before).
                settled = self.ops.settle(self, message.k)
                self.seen["calls"] += 1
                self.ops.look_around(self)
                self.link.send(settled)
        self.kept.clear()
        return ServeAnswer(calls=self.seen["calls"], processes=sorted(self.seen["processes"]),
                           threads=sorted(self.seen["threads"]), modes=sorted(self.seen["modes"]))

    def _map(self, message: Buffers, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        if not self.cuda:  # the memfds come with each call
            self.layouts[message.layout] = _Layout([], [], [], message.inputs, message.spill)
            return
        specs = [spec for spec in (*message.inputs, *message.spill) if spec is not None]

        def tensor(spec: protocol.BufferSpec | None):
            if spec is None:
                return None
            pointer, size = self.memory.open(spec.handle)
            return exchange.view(self.memory.bytes_at(pointer, size), getattr(torch, spec.dtype), spec.shape, spec.stride)

        self.layouts[message.layout] = _Layout([tensor(s) for s in message.inputs], [tensor(s) for s in message.spill],
                                               [spec.handle for spec in specs])

    def _release(self, message: Release) -> None:
        """Unmap the layouts the judge will free (the worker's copies of their outputs with them)."""
        for number in message.layouts:
            layout = self.layouts.pop(number, None)
            for handle in layout.handles if layout else ():
                self.memory.close(handle)
        torch.cuda.empty_cache()

    def _call(self, go: Go, fds: list[int]) -> Done:
        layout = self.layouts[go.layout]
        self.kept.clear()
        if self.cuda:
            shared = layout.inputs
        else:  # this call's own inputs memfd: mapped, and closed (the mapping stays while its tensors live)
            raw = exchange.mapped(fds[0], layout.input_bytes)
            for fd in fds:
                os.close(fd)
            shared = exchange.over(raw, layout.input_specs)
            del raw
        inputs = [t if t is not None else v for t, v in zip(shared, go.values)]
        if self.cuda:
            torch.cuda.set_stream(torch.cuda.default_stream(self.device))
            flags = self.flags[0]
            self.memory.wait_value(torch.cuda.default_stream(self.device), flags.base + exchange.SEQ, go.k)
        findings = None
        try:
            with torch.no_grad():
                if self.audit:
                    out, findings = self.ops.audited(self, inputs)
                else:
                    out = self.model(*inputs)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the forward's, reported as its error
            return Done(k=go.k, error=trimmed("ModelNew.forward", exc))
        outputs = flatten(out)
        odd = [describe(t) for t in outputs if not is_plain(t)]
        if odd:
            return Done(k=go.k, error=f"ModelNew.forward returned {', '.join(odd[:3])} instead of plain tensors")
        self.kept.append(out)
        if not self.cuda:
            return self.ops.spill(self, go.k, layout, outputs, is_sequence(out), findings)
        refs = [self.ops.share(self, t, i, layout) for i, t in enumerate(outputs)]
        if self.cuda:
            stream = torch.cuda.default_stream(self.device)  # the legacy stream: after every blocking stream's work
            torch.cuda.set_stream(stream)
            flags.done(stream, go.k)
        return Done(k=go.k, outputs=refs, sequence=is_sequence(out), findings=findings)

    def _share(self, t: torch.Tensor, index: int, layout: _Layout) -> OutputRef:
        """Where output ``index`` is, for the judge: its own allocation on this GPU, else copied into
        the judge's spill buffer (on the CPU, always)."""
        dtype = str(t.dtype).removeprefix("torch.")
        if self.cuda and t.device == self.device and t.numel():
            base, _ = self.memory.extent(t.data_ptr())
            handle = self.memory.export(base)
            if handle is not None:
                return OutputRef(dtype=dtype, shape=list(t.shape), stride=list(t.stride()),
                                 offset=t.data_ptr() - base, handle=handle)
        spill = layout.spill[index] if index < len(layout.spill) else None
        if spill is None or t.dtype != spill.dtype or t.shape != spill.shape:
            # Not the task's output: the judge's comparison says so from the layout alone.
            return OutputRef(dtype=dtype, shape=list(t.shape), stride=list(t.stride()))
        if t is not spill:
            spill.copy_(t)
        return OutputRef(dtype=dtype, shape=list(t.shape), stride=list(spill.stride()), spilled=True)

    def _spill(self, k: int, layout: _Layout, outputs: list, sequence: bool, findings: Findings | None) -> Done:
        """(The CPU.) The forward has returned: ask for the call's spill buffer, write every output of the
        task's layout into it (the judge seals it against writes as the ``Done`` comes: a mapping still
        writable then fails the call) and say where each output is."""
        self.link.send(Ready(k=k))
        message, fds = self.link.recv(Spill)
        if message.k != k or not fds:
            raise protocol.ProtocolError(f"a spill buffer for call {message.k} when call {k} was running")
        refs = self.ops.copy_out(fds[0], layout, outputs)
        for fd in fds:
            os.close(fd)
        return Done(k=k, outputs=refs, sequence=sequence, findings=findings)

    def _audited(self, inputs: list) -> tuple:
        """One call under the dispatch audit (every ATen operator, from Python or C++) and the Triton launch count."""
        audit = guards.TorchComputeAudit()
        before = self.launches.launches
        with audit:
            out = self.model(*inputs)
        findings = Findings(torch_ops=dict(audit.forbidden), triton_launches=self.launches.launches - before,
                            empty_output=all(isinstance(t, torch.Tensor) and t.numel() == 0 for t in flatten(out)),
                            audited=True)
        return out, findings

    def _settle(self, k: int) -> Settled:
        """Wait for the device to finish this process's work (after ``Done``: outside the judge's clock)."""
        if not self.cuda:
            return Settled(k=k)
        try:
            torch.cuda.synchronize(self.device)
        except BaseException as exc:  # a fault in the candidate's kernels: this process's context is lost
            return Settled(k=k, error=trimmed("ModelNew.forward (on the device)", exc))
        return Settled(k=k)

    def _look_around(self) -> None:
        """After each call has been answered (outside the judge's clock): modes left on torch's stack,
        threads and processes beside the model."""
        self.seen["modes"].update(guards.modes_on_stack())
        if self.integrity is not None:
            self.seen["threads"].update(self.integrity.new_threads())
        if self.processes is not None:
            self.seen["processes"].update(self.processes.new())

    def integrity_report(self) -> protocol.IntegrityAnswer:
        if self.integrity is None:
            return protocol.IntegrityAnswer()
        return protocol.IntegrityAnswer(changes=self.integrity.changes(), new_threads=self.integrity.new_threads(),
                                        processes=self.processes.new() if self.processes is not None else [],
                                        modes=guards.modes_on_stack())


def _bind_package(name: str, folder: Path) -> None:
    """``import name`` finds ``folder`` (the snapshot's ``kernels/``), whatever else on the path has that
    name: a folder without ``__init__.py`` is a namespace package, which any installed package of the
    name beats (Hugging Face's ``kernels``, which transformers >= 5.25 installs)."""
    init = folder / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    else:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    if spec.loader is not None:
        spec.loader.exec_module(package)


def _copy_out(fd: int, layout: _Layout, outputs: list) -> list[OutputRef]:
    """Write each output of the task's layout into the spill memfd ``fd`` (never mapped here: the judge
    seals it as the ``Done`` comes, which a writable mapping would fail)."""
    refs = []
    for index, t in enumerate(outputs):
        dtype = str(t.dtype).removeprefix("torch.")
        spec = layout.spill_specs[index] if index < len(layout.spill_specs) else None
        if spec is None or dtype != spec.dtype or list(t.shape) != spec.shape:
            # Not the task's output: the judge's comparison says so from the layout alone.
            refs.append(OutputRef(dtype=dtype, shape=list(t.shape), stride=list(t.stride())))
            continue
        exchange.write(fd, t, spec.offset, spec.stride)
        refs.append(OutputRef(dtype=dtype, shape=spec.shape, stride=spec.stride, spilled=True))
    return refs


def _init_inputs(path: str):
    """The reference's init inputs as plain data (tensors, numbers, strings, dtypes...), or None."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        return None


def trimmed(stage: str, exc: BaseException) -> str:
    """The exception, with the traceback trimmed to the candidate's own files."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "site-packages" not in f.filename and "/evaluators/" not in f.filename
           and "/run/kernel_env/child/" not in f.filename]
    lines = [f"  {Path(f.filename).name}:{f.lineno} in {f.name}: {f.line or ''}".rstrip() for f in own[-5:]]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if len(message) > 3000:
        message = message[:1500] + "\n[...]\n" + message[-1500:]
    return f"{stage} raised {message}" + ("\n" + "\n".join(lines) if lines else "")
