"""The judge: the trusted process of a job. It runs the task's reference, makes every call's inputs,
reads every output itself and owns the clock; the worker only computes.

It runs the task's code and the harness's, never a candidate's. Each call's inputs are drawn under
a secret seed in the judge's own memory and reach the worker only as the call starts, in buffers the
judge owns (``exchange``: on the CPU a memfd made for the call alone); the judge reads the outputs
itself and compares them in full (``compare``). What the worker sends can only name memory for the
judge to read.

- ``Judge``: one job's calls with a connected worker (``connect``, ``drive``).
- ``WorkerFailed``: the worker broke the protocol, ended, or could not run a call.
- ``load_gated_kernels``: the kernels a call queues behind its gate, loaded ahead.

The clock (``_call_cuda``, ``_call_cpu``, ``_time``) is docs/design.md's "One call, and the clock":
a call's time is the whole call on the judge's clock, never less than the worker's work, and a
change here must keep that true. Nothing is taken out of it here: the harness compares it with the
task's Model timed through the same worker before any candidate code existed in it.

Why one module: the calls and the timing share the clock's sequence, and a reader
checking that no time can be taken off a candidate's work must see all of it in one place.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import threading
import time

import torch

import compare
import exchange
import protocol
from protocol import (
    Buffers,
    BufferSpec,
    CallRecord,
    Done,
    Drive,
    DriveAnswer,
    Findings,
    Flags,
    Go,
    OutputRef,
    ProtocolError,
    Release,
    Ready,
    Released,
    Settled,
    Spill,
    Stop,
    TrialVerdict,
)
from reference import Reference

#: How long the judge waits for the worker to say its call is queued before it opens the gate anyway:
#: a forward that reads its own device results on the host cannot queue its whole call ahead.
_HOST_WAIT_S = 1.0
#: After one call needed that, the judge waits this long at most.
_HOST_WAIT_AGAIN_S = 0.01
#: A worker keeps the device buffers of every layout it was sent while they take less than this; past
#: it (a big task's trial variants: 13 GB a layout on KernelBench level 1) the earlier ones are released.
_LAYOUT_BYTES = 1 << 30
#: (The CPU.) A timed call is compared beside the next call's making (``Judge._beside``) where what is
#: then alive at once (two calls' inputs, answers, copies of the answer and outputs) takes at most this.
_BESIDE_BYTES = 1 << 30


class WorkerFailed(Exception):
    """The worker broke the protocol, ended, or could not run a call (the message says which)."""


class _Layout:
    """The shared buffers of one input layout: on a GPU the inputs the worker computes on (None for a
    non-tensor input) and the spill buffers of the outputs it cannot share, allocations of the judge's
    kept for every call; on the CPU where each lies in a call's own memfds (``input_specs``,
    ``spill_specs``), whose tensors each call makes anew (``inputs``, ``spill``)."""

    def __init__(self, number: int, inputs: list, spill: list, buffers: list, input_specs: list = (), spill_specs: list = ()):
        self.number, self.inputs, self.spill, self.buffers = number, inputs, spill, buffers
        self.input_specs, self.spill_specs = list(input_specs), list(spill_specs)
        self.input_bytes, self.spill_bytes = exchange.extent(self.input_specs), exchange.extent(self.spill_specs)


class Judge:
    """The calls of one job: the judge's side of the protocol with a connected worker."""

    def __init__(self, reference: Reference):
        self.reference = reference
        self.device = reference.device
        self.cuda = self.device.type == "cuda"
        self.link: protocol.Link | None = None
        self.memory = exchange.DeviceMemory(self.device) if self.cuda else None
        self.flags: exchange.Flags | None = None
        self.layouts: dict[tuple, _Layout] = {}
        self.stuck = False  # a call's stream left waiting for the worker (``_call_cuda``): never synchronise again
        self.host_wait_s = _HOST_WAIT_S
        self._k = 0
        self._flush: torch.Tensor | None = None
        self._flush_bytes = 0
        self._loopback: tuple | None = None  # (the CPU) a socket of the judge's own, for ``_own_share``
        self._last_layout: _Layout | None = None
        if self.cuda:
            # Held through each call: another job's timing run freezes this job between calls, never inside
            # one, where the two processes' streams wait on each other (evaluators/sharing.py).
            self.calls_lock = os.open(reference.out_dir / protocol.CALLS_LOCK, os.O_RDONLY | os.O_CLOEXEC)
            self.calls_gate = os.open(reference.out_dir / protocol.CALLS_GATE, os.O_RDONLY | os.O_CLOEXEC)
            self.stream = torch.cuda.current_stream(self.device)
            self.gate = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            self.gate_address = self.memory.host_pointer(self.gate)
            load_gated_kernels(self.device)
        else:
            # One thread of the judge's own: an OpenMP pool's threads spin on after each parallel region
            # (the reference's run, just before a call), and on a small machine took the processors the
            # worker's own parallel regions wait for (a fused C++ kernel timed 5 ms instead of 0.5).
            torch.set_num_threads(1)

    # ------------------------------------------------------------------ the worker

    def connect(self, link: protocol.Link) -> None:
        """Talk to a newly connected worker: its own flags, and buffers made anew as calls need them.

        Args:
            link: the judge's end of the judge–worker socket (``Connect``)."""
        self._free_layouts()  # the previous worker's: it is gone
        self.link, self.host_wait_s = link, _HOST_WAIT_S
        if self.cuda:
            self.flags = exchange.Flags(self.memory)
            self._send(Flags(handle=self.flags.handle))

    def drive(self, req: Drive) -> DriveAnswer:
        """Run the calls of one phase with the connected worker; then tell it to stop.

        Args:
            req: the phase ("trials", "warmup" or "time") and its settings.

        Returns:
            Each call's record (its time, verdict and findings). A worker that breaks the protocol or
            raises ends the phase: ``error`` / ``worker_error`` say why; nothing is raised."""
        answer = DriveAnswer()
        self._flush_bytes = req.flush_bytes
        # The timing run's patience; none for the calls that are not timed (the trials, the warm-up): a
        # forward's first launch of a kernel loads its module, which waits for the device work queued before
        # it, the wait for the call's start among it, until the gate opens.
        self.host_wait_s = _HOST_WAIT_S if req.phase == "time" else 0.0
        try:
            if req.phase == "trials":
                answer.calls = self._trials(req)
            elif req.phase == "warmup":
                answer.calls = [self._warmup_call() for _ in range(req.calls)]
            else:
                answer.calls = self._time(req)
        except WorkerFailed as exc:
            answer.error = str(exc)
        except _WorkerRaised as exc:
            answer.worker_error = str(exc)
        try:
            self._send(Stop())
        except WorkerFailed:
            pass  # it is gone: the harness learns how from the worker's own answer
        return answer

    def _trials(self, req: Drive) -> list[CallRecord]:
        records = []
        trials = self.reference.trials
        # Held to the precision contract: the first trial (the task's own inputs) and one other, which the
        # worker cannot tell from the rest (two runs of the Model in float64 each: not all five).
        contracted = {0, secrets.choice(range(1, len(trials)))} if len(trials) > 1 else {0}
        for index, trial in enumerate(trials):
            staging = self.reference.make_inputs(trial["seed"], trial["variant"])
            expected = (trial["sequence"], trial["expected"], trial["precise"])
            record = self._judged_call("trial", staging, expected, req, trial=index,
                                       contract=trial["variant"] if index in contracted else None)
            records.append(record)
            if not record.verdict.correct:
                break
        # Judged once: freed for the timing run (30 GiB of a KernelBench level-1 task's), which runs its own.
        for trial in self.reference.trials:
            trial["expected"] = trial["precise"] = None
        torch.cuda.empty_cache()  # (nothing where CUDA was never initialised: the CPU)
        return records

    def _time(self, req: Drive) -> list[CallRecord]:
        """The timed calls, each the whole call on the judge's clock, after (on a GPU) as many calls of the
        task's Model in the judge's own process (``local``, as ``RefTime`` times them, after one more to warm
        up): the machine's pace around the worker's calls, which the harness compares with its pace
        around the yardstick's. Every call of the worker's is made alike (its inputs, the reference's
        run, its comparison), so nothing it sees tells a checked call from another."""
        # (Not on the CPU, where a model's speed depends on its process: the judge's pace is not the worker's.)
        local = self.reference.time_with(self._flush_buffer(), req.calls, 1)["eager"] if self.cuda else []
        records = [CallRecord(k=0, kind="local", time_ms=elapsed) for elapsed in local]
        checked = set(secrets.SystemRandom().sample(range(req.calls), min(req.checked, req.calls)))
        # One checked call also under the precision contract: the worker cannot tell which (nor a trial from it).
        contracted = secrets.choice(sorted(checked)) if checked else -1
        pending: _Beside | None = None  # (the CPU) the last call, compared on a thread of the judge's meanwhile
        for index in range(req.calls):
            check = index in checked
            try:
                staging = self.reference.make_inputs(secrets.randbits(31))
                expected = self.reference.run(staging, precise=check)
            except BaseException:
                if pending is not None and not pending.joined().verdict.correct:
                    return records  # the last call's wrong answer is the verdict, not what failed after it
                raise
            if pending is not None:  # compared while this call's inputs and answer were made; over before its clock
                correct, pending = pending.joined().verdict.correct, None
                if not correct:
                    return records
            if check and index != contracted and self._beside(req, staging, expected):
                pending = _Beside(self._call("timed", staging, expected), expected, index, req)
                records.append(pending.record)
                del staging, expected
                continue
            if check:
                record = self._judged_call("timed", staging, expected, req, trial=index,
                                           contract="as_is" if index == contracted else None)
            else:
                record = self._call("timed", staging, expected)[0]
            del staging, expected  # one call's tensors alive at a time (a big task's fill the device)
            records.append(record)
            if record.verdict is not None and not record.verdict.correct:
                break
            if req.own_share and not self.cuda:
                records.append(self._own_share(self._last_layout))
        if pending is not None:
            pending.joined()
        return records

    def _beside(self, req: Drive, staging: list, expected: tuple) -> bool:
        """(The CPU.) Whether this call is compared on a thread of the judge's (``_Beside``), beside the
        making of the next call's inputs and of the reference's answer to them: on the CPU each is a pass
        over a call's bytes on one core, and they were 28 % and 35 % of the judge's time in a timing run
        (relu(x + y) at 4M elements, 2 cores). Never on a GPU, where the comparison is the device's, nor in a
        phase that measures the judge's own share after each call (``_time``); nor for a call of more than
        ``_BESIDE_BYTES`` (its inputs, and its answer, the copy of it compared and the worker's outputs,
        two calls' of those alive at once)."""
        if self.cuda or req.own_share:
            return False
        outputs = [t for t in [*expected[1], *(expected[2] or ())] if isinstance(t, torch.Tensor)]
        inputs = [x for x in staging if isinstance(x, torch.Tensor)]
        return 2 * (sum(t.nbytes for t in inputs) + 3 * sum(t.nbytes for t in outputs)) <= _BESIDE_BYTES

    def _own_share(self, layout: _Layout) -> CallRecord:
        """(The CPU.) What ``_call_cpu``'s clock holds but the worker's part: a ``Go`` sent with a memfd, a
        ``Ready`` received, a ``Spill`` sent with another, a ``Done`` received (these two already waiting, on
        a socket of the judge's own) and the spill memfd sealed. Its memfds are the judge's alone."""
        if self._loopback is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._loopback = (protocol.Link(ours, accept_fds=False), theirs)
        link, theirs = self._loopback
        self._k += 1
        k = self._k
        theirs.send(Ready(k=k).encode())
        theirs.send(Done(k=k, outputs=[OutputRef(dtype=x.dtype, shape=x.shape, stride=x.stride, spilled=True)
                                       for x in layout.spill_specs]).encode())
        inputs_fd = exchange.memfd(layout.input_bytes, exchange.INPUTS)
        spill_fd = exchange.memfd(layout.spill_bytes, exchange.OUTPUTS)
        self._flush_buffer().bitwise_not_()
        started = time.perf_counter_ns()
        link.send(Go(k=k, layout=layout.number), [inputs_fd])
        link.recv((Ready, Done))
        link.send(Spill(k=k), [spill_fd])
        link.recv(Done)
        exchange.seal_writes(spill_fd)
        raw_ms = (time.perf_counter_ns() - started) / 1e6
        for fd in [inputs_fd, spill_fd] + [fd for _ in range(2) for fd in socket.recv_fds(theirs, protocol.MAX_MESSAGE, 4)[1]]:
            os.close(fd)  # (the Go's and the Spill's, sent to nobody)
        return CallRecord(k=k, kind="share", time_ms=raw_ms)

    def _warmup_call(self) -> CallRecord:
        """A call on fresh inputs, neither timed nor compared (the warm-up before a timing run)."""
        staging = self.reference.make_inputs(secrets.randbits(31))
        return self._call("warmup", staging, self.reference.run(staging, precise=False))[0]

    def _judged_call(self, kind: str, staging: list, expected: tuple, req: Drive, *, trial: int,
                     contract: str | None = None) -> CallRecord:
        """A call judged against ``expected``; with ``contract`` (the variant ``staging`` was drawn as), an
        answer within the tolerance is held to the task's precision too (``precision.Contract``: the
        Model in float64 on ``staging``)."""
        record, got = self._call(kind, staging, expected)
        verdict = record.verdict = _verdict(trial, expected, got, req.atol, req.rtol)
        if contract is not None and verdict.correct and self.reference.contract is not None:
            measure = self.reference.contract.measure(staging, expected[1], got[1], contract)
            verdict.float64_error, verdict.eager_float64_error = measure.error, measure.eager_error
            verdict.float64_error_limit, verdict.precision_note = measure.limit, measure.note
            if measure.refused:
                verdict.correct, verdict.message = False, measure.message(len(expected[1]))
        return record

    # ------------------------------------------------------------------ one call

    def _call(self, kind: str, staging: list, expected: tuple):
        """One call of the worker's on ``staging`` (copied in, never handed over), judged against
        ``expected`` (sequence, outputs, float32 outputs). Returns (its record, what the worker
        returned as the judge read it: (sequence, outputs)). The worker's findings go into the record as
        it sent them (so much of them at most): the harness knows whose calls must carry them."""
        _, outputs, _ = expected
        layout = self._last_layout = self._layout(staging, outputs)
        values = [None if isinstance(x, torch.Tensor) else _plain(x) for x in staging]
        self._k += 1
        k = self._k
        go = Go(k=k, layout=layout.number, values=values)
        if self.cuda:
            fcntl.flock(self.calls_gate, fcntl.LOCK_SH)  # waits while a timing run holds the gate (protocol.CALLS_GATE)
            fcntl.flock(self.calls_lock, fcntl.LOCK_EX)
            fcntl.flock(self.calls_gate, fcntl.LOCK_UN)
            try:
                (raw_ms, done, got), inputs = self._call_cuda(go, staging, layout), layout.inputs
            finally:
                if not self.stuck:  # a stream left waiting for the worker waits on the device until the job ends
                    fcntl.flock(self.calls_lock, fcntl.LOCK_UN)
        else:
            raw_ms, done, got, inputs = self._call_cpu(go, staging, layout)
        record = CallRecord(k=k, kind=kind, findings=_capped(done.findings))
        if kind == "timed":
            record.time_ms = raw_ms
        if kind == "trial":
            record.mutated_inputs = any(isinstance(a, torch.Tensor) and not _same(a, b) for a, b in zip(inputs, staging))
        return record, (done.sequence, got)

    def _layout(self, staging: list, outputs: list) -> _Layout:
        """The shared buffers for calls on inputs and outputs laid out like these, made (and described
        to the worker) the first time: on a GPU an allocation each; on the CPU where each lies in a
        call's memfds (the inputs' and the spill buffer's), which every call makes anew."""
        key = (tuple(_signature(x) for x in staging), tuple(_signature(t) for t in outputs))
        if key in self.layouts:
            return self.layouts[key]
        tensors = [x for x in staging if isinstance(x, torch.Tensor)] + list(outputs)
        layouts = [exchange.layout_of(t) for t in tensors]
        count = len(tensors) - len(outputs)
        if self.cuda:
            held = sum(buffer.nbytes for layout in self.layouts.values() for buffer in layout.buffers)
            if self.layouts and held + sum(nbytes for _, _, nbytes in layouts) > _LAYOUT_BYTES:
                self._send(Release(layouts=[layout.number for layout in self.layouts.values()]))
                try:
                    self.link.recv(Released)
                except (EOFError, ProtocolError) as exc:
                    raise WorkerFailed(f"the worker broke the call protocol ({exc})") from None
                self._free_layouts()
            buffers = [exchange.DeviceBuffer(self.memory, nbytes) for _, _, nbytes in layouts]
            shared = [b.tensor(t.dtype, shape, stride) for b, t, (shape, stride, _) in zip(buffers, tensors, layouts)]
            specs = [BufferSpec(_dtype(t), shape, stride, nbytes, handle=b.handle)
                     for b, t, (shape, stride, nbytes) in zip(buffers, tensors, layouts)]
            fds = []
        else:
            specs, buffers, shared, fds = [], [], [None] * len(tensors), []
            for group in (range(count), range(count, len(tensors))):  # the inputs' memfd, the spill buffer's
                total = 0
                for i in group:
                    shape, stride, nbytes = layouts[i]
                    specs.append(BufferSpec(_dtype(tensors[i]), shape, stride, nbytes, offset=total))
                    total += -(-nbytes // 64) * 64  # each tensor 64-byte aligned
        if self.cuda:  # an input or an output (the worker's, strided as it likes) may be copied element-wise
            load_gated_kernels(self.device, {t.dtype for t in tensors})
        inputs, input_specs, index = [], [], 0
        for x in staging:
            is_tensor = isinstance(x, torch.Tensor)
            inputs.append(shared[index] if is_tensor else None)
            input_specs.append(specs[index] if is_tensor else None)
            index += is_tensor
        number = len(self.layouts) + 1
        self._send(Buffers(layout=number, inputs=input_specs, spill=specs[count:]), fds)
        layout = self.layouts[key] = _Layout(number, inputs, shared[count:], buffers, input_specs, specs[count:])
        return layout

    def _free_layouts(self) -> None:
        """Forget every layout, freeing its device buffers (the worker has unmapped them, or is gone;
        freeing synchronises the device, which a stuck stream would never finish: those stay)."""
        for buffer in (b for layout in self.layouts.values() for b in layout.buffers) if not self.stuck else ():
            buffer.free(self.memory)
        self.layouts = {}

    def _call_cuda(self, go: Go, staging: list, layout: _Layout):
        """The clock: docs/design.md, One call, and the clock. Whatever may synchronise this process's
        device (opening another process's memory, allocating) is done before the gate's wait is queued,
        or after it is open: behind the closed gate it would wait for the stream that waits for the gate."""
        memory, flags, stream = self.memory, self.flags, self.stream
        self._send(go)
        done = None
        if self.host_wait_s > 0:
            try:
                done = self._receive_done(go.k, timeout=self.host_wait_s)
            except TimeoutError:
                self.host_wait_s = _HOST_WAIT_AGAIN_S
        snapshot = self._snapshots(done, layout) if done is not None else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush = self._flush_buffer()
        memory.wait_value(stream, self.gate_address, go.k)
        start.record(stream)
        for shared, x in zip(layout.inputs, staging):
            if shared is not None:
                _copy(shared, x)
        torch.bitwise_not(flush, out=flush)
        memory.write_value(stream, flags.base + exchange.SEQ, go.k)
        memory.wait_value(stream, flags.base + exchange.DONE, go.k, equal=True)
        try:
            on_host = done is None
            if on_host:  # the worker is still in its forward on the host: open the gate, then wait for it
                self.gate[0] = go.k
                done = self._receive_done(go.k)
                self._settle(go.k)  # its device through the call before anything here may synchronise
                snapshot = self._snapshots(done, layout)
            torch.bitwise_not(flush, out=flush)
            for source, copy in snapshot:
                _copy(copy, source)
            end.record(stream)
            self.gate[0] = go.k
            if not on_host:  # (on the host, it settled above)
                self._settle(go.k)
            end.synchronize()
        except BaseException:
            # The stream waits for a done word that may never come (the worker failed, or left it): nothing
            # in this process may synchronise the device again; the job ends, and the process with it.
            self.stuck = True
            raise
        return start.elapsed_time(end), done, [copy for _, copy in snapshot]

    def _snapshots(self, done: Done, layout: _Layout) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(where each output is, the judge's own buffer for it): the worker's memory opened and the copies
        allocated now, before anything of the call is queued (a meta placeholder needs no copy)."""
        pairs = []
        for source in self._sources(done, layout):
            if source.device.type == "meta":
                pairs.append((source, source))
            elif exchange.dense(source):
                pairs.append((source, torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device=source.device)))
            else:
                pairs.append((source, torch.empty(source.shape, dtype=source.dtype, device=source.device)))
        return pairs

    def _settle(self, k: int) -> None:
        """Wait until the worker says it is done with the call (its device too, and its look around) and
        waits for the next one. On a GPU a fault in the worker's kernels is said here, before the judge
        waits for its own stream, which waits for the worker's done word. No call starts before: the
        worker's own work after a call is never in the next's time."""
        try:
            settled, _ = self.link.recv(Settled)
        except (EOFError, ProtocolError) as exc:
            raise WorkerFailed(f"the worker broke the call protocol ({exc})") from None
        if settled.k != k:
            raise WorkerFailed(f"the worker settled call {settled.k} when call {k} was running")
        if settled.error is not None:
            raise _WorkerRaised(settled.error)

    def _call_cpu(self, go: Go, staging: list, layout: _Layout):
        """The clock: docs/design.md, One call, and the clock. The call's inputs are written into a memfd
        made for this call alone before the clock starts, and the worker gets it with the ``Go``: nothing
        it held before can show it the inputs. Its spill buffer, another memfd of the call's own, goes to
        the worker only once its forward has returned (``Ready``), so no output is computed into it in
        place of the worker's copy; and the clock stops once it is sealed against writes, after the
        ``Done``: what the judge reads is what it held then, whatever the worker's threads do after.
        Nothing of the judge's own copies is in the clock, and nothing the worker can reach before ``Go``
        or change after the seal is in what the call's time holds."""
        inputs_fd = exchange.memfd(layout.input_bytes, exchange.INPUTS)
        spill_fd = exchange.memfd(layout.spill_bytes, exchange.OUTPUTS)
        try:
            inputs = exchange.over(exchange.mapped(inputs_fd, layout.input_bytes), layout.input_specs)
            for shared, x in zip(inputs, staging):
                if shared is not None:
                    shared.copy_(x)
            self._flush_buffer().bitwise_not_()  # the caches hold none of the call's data
            started = time.perf_counter_ns()
            self._send(go, [inputs_fd])
            self._receive_ready(go.k)
            self._send(Spill(k=go.k), [spill_fd])
            done = self._receive_done(go.k)
            sealed = exchange.seal_writes(spill_fd)
            raw_ms = (time.perf_counter_ns() - started) / 1e6
            if not sealed:
                raise WorkerFailed("the worker still had the call's spill buffer mapped for writing after its answer "
                                   "(an output could still change while the judge reads it)")
            spill = exchange.over(exchange.mapped(spill_fd, layout.spill_bytes, private=True), layout.spill_specs)
        finally:
            os.close(inputs_fd)
            os.close(spill_fd)
        got = self._sources(done, layout, spill)
        self._settle(go.k)
        return raw_ms, done, got, inputs

    def _receive_ready(self, k: int) -> None:
        """(The CPU.) The worker's word that call ``k``'s forward has returned; a ``Done`` in its place
        says why not (the forward raised)."""
        try:
            message, _ = self.link.recv((Ready, Done))
        except (EOFError, ProtocolError) as exc:
            raise WorkerFailed(f"the worker broke the call protocol ({exc})") from None
        if message.k != k:
            raise WorkerFailed(f"the worker answered call {message.k} when call {k} was asked")
        if isinstance(message, Done):
            if message.error is not None:
                raise _WorkerRaised(message.error)
            raise WorkerFailed("the worker answered before it asked for the call's spill buffer")

    def _receive_done(self, k: int, timeout: float | None = None) -> Done:
        try:
            done, _ = self.link.recv(Done, timeout)
        except TimeoutError:
            raise
        except (EOFError, ProtocolError) as exc:
            raise WorkerFailed(f"the worker broke the call protocol ({exc})") from None
        if done.k != k:
            raise WorkerFailed(f"the worker answered call {done.k} when call {k} was asked")
        if done.error is not None:
            raise _WorkerRaised(done.error)
        return done

    def _sources(self, done: Done, layout: _Layout, spill: list | None = None) -> list[torch.Tensor]:
        """The worker's outputs, where it says they are, as tensors the judge reads (never writes). An
        output of another shape or dtype than the task's needs no reading: a placeholder of its layout
        (on the meta device) carries the comparison's verdict. ``spill``: the call's spill buffers
        (the CPU's, sealed), else the layout's."""
        spill = layout.spill if spill is None else spill
        if len(done.outputs) > 4096:
            raise WorkerFailed("the worker named more outputs than a call can have")
        sources = []
        for index, ref in enumerate(done.outputs):
            try:
                dtype = getattr(torch, ref.dtype)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"no dtype {ref.dtype!r}")
                expected = spill[index] if index < len(spill) else None
                if expected is None or list(expected.shape) != ref.shape or expected.dtype != dtype:
                    sources.append(torch.empty(ref.shape, dtype=dtype, device="meta"))
                elif ref.spilled:
                    sources.append(expected)
                elif self.cuda and ref.handle is not None:
                    pointer, size = self.memory.open(ref.handle)
                    sources.append(exchange.view(self.memory.bytes_at(pointer, size), dtype, ref.shape, ref.stride, ref.offset))
                else:
                    raise ValueError("an output that is neither spilled nor shared")
            except (ValueError, TypeError, RuntimeError, AttributeError) as exc:
                raise WorkerFailed(f"the worker named output {index} where the judge cannot read it ({exc})") from None
        return sources

    def _flush_buffer(self) -> torch.Tensor:
        """The phase's cache flush, ``Drive.flush_bytes`` (the harness caps it on the CPU: ``_Script._flush_bytes``)."""
        size = max(self._flush_bytes, 1)
        if self._flush is None or self._flush.numel() != size:
            self._flush = torch.zeros(size, dtype=torch.uint8, device=self.device)
        return self._flush

    def _send(self, message: protocol.Message, fds: list[int] = ()) -> None:
        try:
            self.link.send(message, fds)
        except OSError as exc:
            raise WorkerFailed(f"the worker is gone ({exc})") from None


class _WorkerRaised(Exception):
    """The worker's forward raised, or returned something that is not plain tensors (its words)."""


class _Beside:
    """(The CPU.) A timed call's comparison, on a thread of its own while the judge makes the next call
    (``Judge._beside``). It compares a copy of the reference's answer, made before the next answer is
    (a Model may answer in a tensor of its own, the same every call, which that run would overwrite),
    with the worker's outputs as sealed. Only the thread holds those, and it frees them before it ends
    (``Thread.run`` drops its arguments): ``joined``, which waits for that end, returns with them freed,
    before the next call's clock starts."""

    def __init__(self, called: tuple, expected: tuple, index: int, req: Drive):
        self.record, got = called
        sequence, outputs, precise = expected
        answer = (sequence, _copies(outputs), _copies(precise) if precise is not None else None)
        self._verdict: TrialVerdict | BaseException | None = None
        self._thread = threading.Thread(target=self._compare, args=(index, answer, got, req.atol, req.rtol),
                                        name="judge-compare", daemon=True)
        self._thread.start()

    def _compare(self, index: int, answer: tuple, got: tuple, atol: float, rtol: float) -> None:
        try:
            self._verdict = _verdict(index, answer, got, atol, rtol)
        except BaseException as exc:  # raised in the judge's own thread by ``joined``
            self._verdict = exc

    def joined(self) -> CallRecord:
        self._thread.join()
        verdict, self._verdict = self._verdict, None
        if isinstance(verdict, BaseException):
            raise verdict
        self.record.verdict = verdict
        return self.record


def _copies(values: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in values]


def _verdict(trial: int, expected: tuple, got: tuple, atol: float, rtol: float) -> TrialVerdict:
    """``compare``'s report on the worker's outputs against the reference's, or against the float32
    run's where it differs from the reference (matching either is correct)."""
    sequence, outputs, precise = expected
    got_sequence, got_outputs = got
    candidate = got_outputs if got_sequence else (got_outputs[0] if len(got_outputs) == 1 else got_outputs)
    report = compare.compare_outputs(trial, outputs if sequence else outputs[0], candidate, atol, rtol)
    if not report.correct and precise is not None:
        second = compare.compare_outputs(trial, precise if sequence else precise[0], candidate, atol, rtol)
        if second.correct:
            report = second
    return report


def _capped(findings: Findings | None) -> Findings | None:
    if findings is not None and len(findings.torch_ops) > 32:
        findings.torch_ops = dict(sorted(findings.torch_ops.items())[:32])
    return findings


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _signature(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return (str(x.dtype), tuple(x.shape), tuple(exchange.layout_of(x)[1]))
    return ("value",)


def _plain(value):
    """A non-tensor input as the protocol carries it (JSON scalars, lists of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise WorkerFailed(f"the task's get_inputs() returned a {type(value).__name__}, which cannot be handed to the worker")


def _dense_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor without gaps or overlaps, as a flat uint8 tensor over the same memory."""
    nbytes = t.numel() * t.element_size()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() * t.element_size(), (nbytes,), (1,))


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst`` := ``src`` by a kernel, never a copy engine: the worker's kernels cannot run beside it
    (the GPU's compute engine runs one process's work at a time), and a copy engine could."""
    if not dst.numel() or dst.device.type == "meta":
        return
    if dst.stride() == src.stride() and exchange.dense(dst) and exchange.dense(src):
        torch.bitwise_or(_dense_bytes(src), 0, out=_dense_bytes(dst))
    else:
        dst.copy_(src)  # strided on one side: an elementwise kernel


#: The dtypes whose element-wise copies a judge spare loads before it has a job (``load_gated_kernels``);
#: another dtype's load with the first layout that has one.
COMMON_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
                 torch.int8, torch.uint8, torch.bool)
_loaded: set = set()  # what ``load_gated_kernels`` has loaded in this process (its one device)


def load_gated_kernels(device: torch.device, dtypes=()) -> None:
    """Launch once, before any call, the kernels ``_call_cuda`` queues behind its closed gate: with
    CUDA's lazy loading a kernel's first launch loads it, which waits for the work queued before it
    on the device, the gate's wait among it, and the call would never start. (Until 2026-11-27 the
    trivial-answer screen happened to load the byte copies first; a job that skipped the screen
    hung.) Byte copies (``_copy`` of dense tensors) are vectorised by their alignment, each width a
    kernel of its own, so every offset is run; an element-wise copy (``_copy`` of a strided tensor:
    an input, or an output the worker returns strided as it likes) is a kernel per dtype."""
    wanted = set(dtypes) - _loaded
    if "bytes" in _loaded and not wanted:
        return
    if "bytes" not in _loaded:
        source, target = (torch.zeros(1024, dtype=torch.uint8, device=device) for _ in range(2))
        for offset in (0, 1, 2, 4, 8):
            _copy(target[offset:offset + 512], source[offset:offset + 512])
            torch.bitwise_not(target[offset:offset + 512], out=target[offset:offset + 512])
        _loaded.add("bytes")
    for dtype in wanted:
        source = torch.zeros((4, 4), dtype=dtype, device=device)
        torch.zeros((4, 4), dtype=dtype, device=device).t().copy_(source)
        torch.empty((4, 4), dtype=dtype, device=device).copy_(source.t())
        _loaded.add(dtype)
    torch.cuda.synchronize(device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the worker left an input as it was given (NaN equal to NaN)."""
    if a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()))
    return bool(torch.equal(a, b))

