"""Evaluation child process: runs either the reference task or a candidate, never both.

Forked by the fork server (``zygote.py``, which imported it with torch, Triton and its sibling
modules ``timing``, ``guards`` and ``compare``) into an isolated process of its own, which runs
``main("reference")`` or ``main("candidate")``. Commands arrive as JSON lines on stdin (after a
first line holding the key of ``Channel``); answers go out, signed, on the file descriptor
named by ``KE_REPLY_FD`` (stdout and stderr belong to the code under test and are only
logged). The reference process keeps its trial outputs in its own memory (on the device)
and never writes them anywhere; the candidate process writes each trial's outputs to a file
(``write_outputs``), which the parent moves into the reference process's directory, and the
reference process reads it and compares (``compare.py``). The candidate process never
computes, loads or holds a reference output, so there is nothing for it to find, in memory
or on disk.

Why one long module: it is the whole of what a child process does, read in one place by
whoever audits the process boundary; its parts (the channel, the reference's steps, the
candidate's steps, the trial files) share the process's state and are split into classes.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import gc
import importlib.util
import json
import math
import os
import pickle
import socket
import stat
import sys
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import compare  # noqa: E402
import guards  # noqa: E402
import screen  # noqa: E402
import timing  # noqa: E402

#: The largest trial output file the reference process reads.
MAX_OUTPUT_FILE = 4 << 30
_MAX_HEADER = 1 << 20
_PINNED_LIMIT = 1 << 30  # larger outputs go through pageable memory rather than pin this much at once

try:
    from _hashlib import hmac_digest as _hmac_digest  # C: nothing the code under test patches reaches it
except ImportError:  # Python built without OpenSSL
    import hmac as _hmac

    _hmac_digest = _hmac.digest
_json_dumps = json.dumps


class Channel:
    """The runner's way to the parent: answers on the reply pipe (``KE_REPLY_FD``), timing marks
    on a datagram socket the kernel timestamps on send (``KE_MARK_FD``, see children.py).

    Both descriptors are open in the candidate's process, so each answer and mark carries an
    HMAC under a key the parent sends as the very first line on stdin, before any code under
    test is imported. The key lives only in the instance ``main`` keeps: a candidate that writes
    to the descriptors itself forges nothing the parent accepts."""

    def __init__(self, key: bytes):
        self._key = key
        self._reply = os.fdopen(os.dup(int(os.environ.get("KE_REPLY_FD", "1"))), "w", buffering=1)
        marks = os.environ.get("KE_MARK_FD")
        self._mark_send = socket.socket(fileno=int(marks)).send if marks else None

    def _sign(self, text: str) -> str:
        return _hmac_digest(self._key, text.encode(), "sha256").hex()[:32]

    def reply(self, **payload) -> None:
        text = _json_dumps(payload)
        self._reply.write(f"{text}\t{self._sign(text)}\n")
        self._reply.flush()

    def mark(self, kind: str, k: int) -> None:
        if self._mark_send is not None:
            text = f"{kind}:{k}"
            self._mark_send(f"{text}:{self._sign(text)}".encode())


class Runner:
    def __init__(self, channel: Channel):
        self.channel = channel
        self.device = torch.device("cpu")
        self.task: dict = {}
        self.model = None
        self.out_dir = Path(".")
        self.pid_namespace = False
        self.processes: guards.Processes | None = None  # the process watch (guards.Processes), from cand_load
        self.spare: frozenset[int] = frozenset()  # the model's weight and buffer storages, never poisoned
        self.expected: dict[int, tuple[bool, list[torch.Tensor]]] = {}  # the reference's trial outputs, by trial
        # ... and, for a task whose outputs are float16 or bfloat16, the same trials run in float32 and
        # rounded once to the outputs' dtypes, where the task runs so (``_precise``)
        self.precise: dict[int, list[torch.Tensor]] = {}
        self.model32 = None

    # ------------------------------------------------------------------ shared

    def settle(self) -> None:
        """Wait until the device has done everything this process launched: a command's work ends
        with its answer, so a job sharing the device can start timing once the steps in flight have
        answered (sharing.py)."""
        if self.device.type == "cuda":
            timing._cuda_synchronize(self.device)

    def load_task(self, code: str) -> None:
        namespace: dict = {"__name__": "kernelbench_task"}
        exec(compile(code, "model.py", "exec"), namespace)
        self.task = namespace

    def make_inputs(self, seed: int, variant: str = "as_is") -> list:
        """The task's inputs for a seed, created on the device (identically in both roles: the same
        code, seed and device), so generating them between timed calls is quick and keeps the GPU
        busy; a trial's reshaped by its ``variant`` (``screen.vary``)."""
        torch.manual_seed(seed)
        with torch.device(self.device):
            inputs = self.task["get_inputs"]()
        return screen.vary([x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs], variant, seed)

    def cmd_setup(self, req: dict) -> dict:
        self.pid_namespace = bool(req.get("pid_namespace"))  # a namespace of our own: /proc lists only our processes
        self.device = torch.device(req["device"])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.out_dir = Path(req["out_dir"])
        self.load_task(req["task_code"])
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {"device_name": name, "torch": torch.__version__}

    def cmd_device_probe(self, req: dict) -> dict:
        return {"busy_ms": timing.other_work_ms(self.device)}

    def run_trials(self, seeds: list[int], keep, audit_fn=None, variants: list[str] | None = None) -> list[dict]:
        """Each seed's call on fresh inputs of its ``variants`` entry; ``keep(index, sequence,
        outputs, inputs)`` takes the outputs of a call that returned plain tensors only, with the
        inputs as they were before the call. The reference's trials (no ``audit_fn``) fall back to
        the task's own inputs where a variant takes them out of its domain (``screen``)."""
        reports = []
        for index, seed in enumerate(seeds):
            variant = variants[index] if variants else "as_is"
            inputs, pristine, out, extra = self._trial(seed, variant, audit_fn)
            if audit_fn is None and variant != "as_is" and (
                    out is None or not screen.finite([t for t in timing.flatten(out) if isinstance(t, torch.Tensor)])):
                variant, inputs, pristine, out = "as_is", None, None, None  # freed before the second call
                inputs, pristine, out, extra = self._trial(seed, variant, audit_fn)
            outputs = timing.flatten(out)
            kinds = [timing.describe(t) for t in outputs if not timing.is_plain(t)]
            # Before ``keep``, which may run the Model again on ``pristine`` (the reference's float32 run).
            mutated = any(
                isinstance(a, torch.Tensor) and (a.shape != b.shape or not torch.equal(a.nan_to_num(), b.nan_to_num()))
                for a, b in zip(inputs, pristine)
            )
            if not kinds:
                keep(index, timing.is_sequence(out), [t.detach() for t in outputs], pristine)
            reports.append({"variant": variant, "mutated_inputs": mutated, "non_tensor_outputs": kinds, **extra})
            del out, outputs, inputs, pristine
        return reports

    def _trial(self, seed: int, variant: str, audit_fn) -> tuple:
        """(inputs, a copy of them as made, the output, the audit's findings) of one trial call. A
        reference call on a variant's inputs that raises (or a variant that cannot reshape them: an
        expanded tensor, infinite bounds) gives the output None (see ``run_trials``)."""
        fallible = audit_fn is None and variant != "as_is"
        try:
            inputs = self.make_inputs(seed, variant)
            pristine = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                out, extra = audit_fn(inputs) if audit_fn else (self.model(*inputs), {})
        except Exception:
            if not fallible:
                raise
            return None, None, None, {}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return inputs, pristine, out, extra

    def _time(self, req: dict, fn, audit=None, after_call=None) -> dict:
        details: dict = {}
        times, prints = timing.time_calls(
            fn, self.make_inputs, _streamed_seeds(req), self.device, warmup_seeds=req.get("warmup_seeds", ()),
            flush_bytes=req["flush_bytes"], launch_cover_us=req.get("launch_cover_us", 0.0),
            fp_seed=req["fp_seed"], signal=self.channel.mark,
            audit=audit, audit_at=req.get("audit_at", ()), details=details, after_call=after_call, spare=self.spare,
        )
        return {"times_ms": times, "fingerprints": prints, "details": details}

    # ------------------------------------------------------------------ reference

    def cmd_ref_init(self, req: dict) -> dict:
        torch.manual_seed(req["init_seed"])
        init = self.task["get_init_inputs"]()
        try:
            torch.save(init, self.out_dir / "init_inputs.pt")
        except Exception:  # noqa: BLE001 - not picklable (torch.channels_last): the candidate's process makes them itself
            torch.save(None, self.out_dir / "init_inputs.pt")
        torch.manual_seed(req["init_seed"])
        self.model = self.task["Model"](*init).to(self.device).eval()
        self.spare = timing.module_storages(self.model)
        torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, self.out_dir / "state_dict.pt")
        return {}

    def cmd_ref_trials(self, req: dict) -> dict:
        """The trials' outputs, kept; each trial's variant (``screen``: the candidate's trials use the
        same); the trivial answers that pass them all (``screen.TrivialAnswers``)."""
        try:
            allowed = screen.task_variants(self.task)
        except ValueError as exc:
            return {"error": f"the task's {exc}"}
        variants = screen.trial_variants(len(req["seeds"]), allowed) if req.get("vary", True) else None
        answers = screen.TrivialAnswers(req.get("atol", 1e-2), req.get("rtol", 1e-2))

        output_bytes = 0

        def keep(index: int, sequence: bool, outputs: list[torch.Tensor], inputs: list) -> None:
            nonlocal output_bytes
            kept = self._kept(outputs)
            self.expected[index] = (sequence, kept)
            output_bytes += sum(t.nbytes for t in kept)
            precise = self._precise(inputs, outputs)
            if precise is not None:
                self.precise[index] = precise = self._kept(precise)
            answers.add(kept, inputs, precise)  # a trivial answer that passes either reference counts

        trials = self.run_trials(req["seeds"], keep, variants=variants)
        return {"trials": trials, "trivial": answers.reasons(), "output_bytes": output_bytes}

    def _kept(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies (an output may be a view of an input or a buffer), on the device while it keeps a
        quarter of its memory free for the candidate, else in this process's host memory."""
        free, total = torch.cuda.mem_get_info(self.device) if self.device.type == "cuda" else (0, 0)
        on_device = sum(t.nbytes for t in outputs) < free - total // 4
        return [t.clone() if on_device else t.to("cpu", copy=True) for t in outputs]

    def _precise(self, inputs: list, outputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The Model run in float32 on ``inputs`` (their float16 and bfloat16 tensors made float32),
        each output rounded once to its dtype: for a task with float16 or bfloat16 outputs, where the
        float32 run gives outputs of the same shapes. A fused kernel that computes in float32 and
        rounds once differs from the task's own run, which rounds at every step, by more than the
        tolerance at times (``x * y + x`` in bfloat16); it matches this one. None otherwise."""
        if not any(t.dtype in _LOW_PRECISION for t in outputs):
            return None
        try:
            if self.model32 is None:
                self.model32 = copy.deepcopy(self.model).float()
            # Copies (``float()`` of a half tensor is one): the Model may change its inputs in place.
            wide = [(x.float() if x.dtype in _LOW_PRECISION else x.clone()) if isinstance(x, torch.Tensor) else x for x in inputs]
            with torch.no_grad():
                got = timing.flatten(self.model32(*wide))
        except Exception:  # noqa: BLE001 - the task does not run in float32: its own run is the only reference
            return None
        if len(got) != len(outputs) or any(not isinstance(g, torch.Tensor) or g.shape != t.shape for g, t in zip(got, outputs)):
            return None
        return [g.detach().to(t.dtype) for g, t in zip(got, outputs)]

    def cmd_ref_release(self, req: dict) -> dict:
        """Drop the Model and its memory: from here on this process only compares (``ref_compare``)."""
        self.model = self.model32 = None  # freed by their reference counts; a gc.collect() here took 0.15-0.2 s
        self.task = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {}

    def cmd_ref_compare(self, req: dict) -> dict:
        """Compare trial ``trial``'s outputs with the candidate's, read from ``file`` (which the
        candidate's process wrote, so nothing about it is trusted), on the device that holds the
        reference's, or on the host where the device has no room. The file is removed."""
        sequence, expected = self.expected.pop(req["trial"])
        precise = self.precise.pop(req["trial"], None)
        try:
            try:
                return self._compare(req, sequence, expected, precise, expected[0].device if expected else self.device)
            except torch.OutOfMemoryError:  # the candidate's copy, or the full check's float64 work
                pass
            expected = [t.cpu() for t in expected]
            precise = [t.cpu() for t in precise] if precise is not None else None
            gc.collect()
            torch.cuda.empty_cache()
            return self._compare(req, sequence, expected, precise, torch.device("cpu"))
        except (OSError, ValueError) as exc:
            return {"unreadable": f"{type(exc).__name__}: {exc}"}
        finally:
            with contextlib.suppress(OSError):
                os.unlink(req["file"])

    @staticmethod
    def _compare(req: dict, sequence: bool, expected: list[torch.Tensor], precise: list[torch.Tensor] | None,
                 device: torch.device) -> dict:
        """The candidate's outputs against the reference's; where they differ, against the float32
        run's (``_precise``) too: matching either is correct."""
        got_sequence, got = read_outputs(req["file"], device)
        candidate = got if got_sequence else got[0]
        report = compare.compare_outputs(req["trial"], expected if sequence else expected[0], candidate, req["atol"], req["rtol"])
        if not report.correct and precise is not None:
            precise = [t.to(device) for t in precise]
            second = compare.compare_outputs(req["trial"], precise if sequence else precise[0], candidate, req["atol"], req["rtol"])
            if second.correct:
                report = second
        return {"report": dataclasses.asdict(report)}

    def cmd_ref_fingerprints(self, req: dict) -> dict:
        """Fingerprints of the outputs of the checked timed calls; for a float16 or bfloat16 task,
        of its float32 run's too (``_precise``; None where there is none): matching either passes."""
        prints, precise = [], []
        with torch.no_grad():
            for seed in req["seeds"]:
                inputs = self.make_inputs(seed)
                outputs = timing.flatten(self.model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]))
                prints.append(timing.fingerprint(outputs, req["fp_seed"]))
                wide = self._precise(inputs, [t for t in outputs if isinstance(t, torch.Tensor)]) \
                    if all(isinstance(t, torch.Tensor) for t in outputs) else None
                precise.append(timing.fingerprint(wide, req["fp_seed"]) if wide is not None else None)
        return {"fingerprints": prints, "precise": precise}

    def cmd_ref_screen(self, req: dict) -> dict:
        """Facts for the synthesis filter (``kernel_env.workloads.synth.filter``, which decides; nothing here does).

        Without ``compile``: the Model on the inputs of ``seeds[0]`` twice (fresh copies, the random
        state moving on between the calls, as it would in use) and on those of ``seeds[1]`` once;
        reports the outputs' signatures, whether they are finite, each output's spread (max - min),
        the largest difference between the two identical calls and between the two inputs, and the
        largest magnitude. With ``compile``: ``torch.compile(Model)`` on the inputs of ``seeds[0]``
        against eager; reports the largest difference and its allowed tolerance's scale."""
        first = self.make_inputs(req["seeds"][0])
        with torch.no_grad():
            eager = timing.flatten(self.model(*_copies(first)))
            if req.get("compile"):
                compiled = timing.flatten(torch.compile(self.model)(*_copies(first)))
                return {"compile_max_diff": _max_diff(eager, compiled), "scale": _scale(eager)}
            again = timing.flatten(self.model(*_copies(first)))
            other = timing.flatten(self.model(*self.make_inputs(req["seeds"][1])))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        kinds = [type(t).__name__ for t in eager if not isinstance(t, torch.Tensor)]
        if kinds:
            return {"non_tensor_outputs": kinds}
        return {
            "non_tensor_outputs": [],
            "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in eager],
            "finite": all(bool(torch.isfinite(t).all()) for t in eager if t.is_floating_point() or t.is_complex()),
            "spreads": [_spread(t) for t in eager],
            "numels": [t.numel() for t in eager],
            "repeat_max_diff": _max_diff(eager, again),
            "input_max_diff": _max_diff(eager, other),
            "scale": _scale(eager),
        }

    def cmd_ref_time(self, req: dict) -> dict:
        fn = self.model
        if req["target"] == "compile":
            fn = torch.compile(self.model)
        return self._time(req, fn)

    # ------------------------------------------------------------------ candidate

    def cmd_cand_load(self, req: dict) -> dict:
        snapshot = Path(req["snapshot"])
        self.language = req["language"]
        self.launches = guards.KernelLaunchCounter()
        self.launches.install()
        guards.watch_host_reads()
        self.integrity = guards.Integrity(instances={"the evaluator's runner": self})
        self.processes = guards.Processes() if self.pid_namespace else None
        # The trials' bench and the device record, made (the cover kernel compiled, the record
        # tried once) before any candidate code is imported.
        self.bench = timing.Bench(self.device, launch_cover_us=req.get("launch_cover_us", 0.0))
        self.record = guards.DeviceRecord(self.device, timing.COVER_KERNEL, timing.END_KERNEL)
        record_problem = self.record.probe() if self.device.type == "cuda" else None
        sys.path.insert(0, str(snapshot))
        sys.path.insert(0, str(snapshot / "build"))
        init = _init_inputs(req["init_inputs"])
        if init is None:
            # Values only a full unpickling rebuilds (a class, a range), or none could be saved: made here as
            # the reference made them (the same code and seed; no candidate code has run in this process yet).
            torch.manual_seed(req["init_seed"])
            init = self.task["get_init_inputs"]()
        reference_state = torch.load(req["state_dict"], weights_only=True)
        spec = importlib.util.spec_from_file_location("model_new", snapshot / "model_new.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["model_new"] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            error = _trimmed("importing model_new.py", exc, snapshot)
            if "undefined symbol" in str(exc):
                error += (f"\n(this worker runs torch {torch.__version__}: was build/ built against another torch? "
                          "Run `bash utils/compile.sh` again.)")
            return {"error": error}
        if not hasattr(module, "ModelNew"):
            return {"error": "model_new.py does not define ModelNew"}
        torch.manual_seed(req["init_seed"])
        try:
            model = module.ModelNew(*init)
        except Exception as exc:
            return {"error": _trimmed("ModelNew(*get_init_inputs())", exc, snapshot)}
        if not isinstance(model, torch.nn.Module):
            return {"error": "ModelNew(...) is not a torch.nn.Module"}
        own = model.state_dict()
        matched = {k: v for k, v in reference_state.items() if k in own and own[k].shape == v.shape}
        mismatched = sorted(k for k, v in reference_state.items() if k in own and own[k].shape != v.shape)
        model.load_state_dict(matched, strict=False)
        self.model = model.to(self.device).eval()
        self.spare = timing.module_storages(self.model)
        return {"loaded_weights": sorted(matched), "shape_mismatch": mismatched,
                "missing_weights": sorted(k for k in reference_state if k not in own), "record_problem": record_problem}

    def _audited_call(self, inputs: list, bench: timing.Bench):
        """One untimed call under every run-time check, behind the same preamble as a timed call
        and between the same marks: the dispatch audit (torch compute, data copied to the host),
        the Triton launch count, the process watch, and the device's own record of everything
        the call ran on any stream (work that runs outside the marks)."""
        audit = guards.TorchComputeAudit()
        bench.marks.use_default_stream()
        with self.record:
            bench.ready(audited=True)
            bench.marks.mark()
            before = self.launches.launches  # the call's launches only: the cover and end mark are Triton kernels too
            with audit:
                out = self.model(*inputs)
            launched = self.launches.launches - before
            bench.marks.mark()
            bench.audited_end()
            bench.marks.sync()
        return out, {"torch_ops": audit.forbidden, "triton_launches": launched,
                     "empty_output": all(isinstance(t, torch.Tensor) and t.numel() == 0 for t in timing.flatten(out)),
                     "processes": self._new_processes(), **self.record.outside()}

    def _new_processes(self) -> list[str]:
        return self.processes.new() if self.processes is not None else []

    def cmd_cand_trials(self, req: dict) -> dict:
        try:
            return {"trials": self.run_trials(
                req["seeds"], lambda index, sequence, outputs, _: write_outputs(self.out_dir / f"cand_trial_{index}.out", sequence, outputs),
                audit_fn=lambda inputs: self._audited_call(inputs, self.bench), variants=req.get("variants"))}
        except Exception as exc:
            return {"error": _trimmed("ModelNew.forward", exc, None)}

    def cmd_cand_warmup(self, req: dict) -> dict:
        try:
            with torch.no_grad():
                for seed in req["seeds"]:
                    timing.poison(self.model(*self.make_inputs(seed)), self.spare)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as exc:
            return {"error": _trimmed("ModelNew.forward (warm-up)", exc, None)}
        return {}

    def cmd_cand_time(self, req: dict) -> dict:
        audits: list[dict] = []

        def audit(inputs: list, bench: timing.Bench) -> None:
            with torch.no_grad():
                out, found = self._audited_call(inputs, bench)
            timing.poison(out, self.spare)
            audits.append(found)

        processes: set[str] = set()  # alive after any timed call: work there escapes the end mark's synchronise
        threads: set[str] = set()

        def watch() -> None:
            processes.update(self._new_processes())
            threads.update(self.integrity.new_threads())

        try:
            timed = self._time(req, self.model, audit, after_call=watch)
            return {**timed, "audits": audits, "processes": sorted(processes), "threads": sorted(threads)}
        except Exception as exc:
            return {"error": _trimmed("ModelNew.forward (timed)", exc, None)}

    def cmd_cand_integrity(self, req: dict) -> dict:
        return {"changes": self.integrity.changes(), "new_threads": self.integrity.new_threads(),
                "processes": self._new_processes()}


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def write_outputs(path: Path, sequence: bool, outputs: list[torch.Tensor]) -> None:
    """A trial's outputs as one file: an 8-byte little-endian header length, a JSON header (whether
    the call returned a sequence; each output's dtype and shape), then each output's bytes in
    row-major order. Plain bytes, no pickle: the reference process reads it (``read_outputs``)."""
    # Into page-locked memory from the device: the copy runs at full speed (into fresh pageable
    # memory, a 64 MB output took 46 ms on an H100 machine, most of it page faults).
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.nbytes <= _PINNED_LIMIT).copy_(t) if t.is_cuda else t
            for t in outputs]
    header = json.dumps({"sequence": sequence, "outputs": [
        {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in host]}).encode()
    with open(path, "wb", buffering=0) as handle:
        _write_all(handle, len(header).to_bytes(8, "little") + header)
        for t in host:
            if t.numel():
                dense = t.contiguous()  # held here: the byte view does not keep the tensor alive
                _write_all(handle, _bytes_of(dense))


def read_outputs(path: str, device: torch.device) -> tuple[bool, list[torch.Tensor]]:
    """What ``write_outputs`` wrote, onto ``device``; the file comes from the candidate's process,
    so anything but a regular file of that exact layout is a ValueError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # no link, and a FIFO does not block
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_OUTPUT_FILE:
            raise ValueError(f"{info.st_size} bytes is more than an output file may take")
        length = int.from_bytes(_read_exactly(handle, 8), "little")
        if length > _MAX_HEADER:
            raise ValueError("not an output file (header too long)")
        try:
            sequence, specs = _layout(json.loads(_read_exactly(handle, length)))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("not an output file (bad header)") from None
        sizes = [math.prod(shape) * dtype.itemsize for dtype, shape in specs]
        if 8 + length + sum(sizes) != info.st_size:
            raise ValueError("not an output file (its size does not match its header)")
        outputs = []
        for (dtype, shape), size in zip(specs, sizes):
            raw = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda" and size <= _PINNED_LIMIT)
            if size:
                _read_into(handle, raw)
            try:
                outputs.append(raw.view(dtype).reshape(shape).to(device))
            except RuntimeError as exc:
                if isinstance(exc, torch.OutOfMemoryError):
                    raise
                raise ValueError(f"not an output file ({str(exc).splitlines()[0][:200]})") from None
        return sequence, outputs


def _layout(header) -> tuple[bool, list[tuple[torch.dtype, list[int]]]]:
    """An output file's header, checked: whether the call returned a sequence, and each output's dtype and shape."""
    if not isinstance(header, dict) or not isinstance(header.get("sequence"), bool) or not isinstance(header.get("outputs"), list):
        raise ValueError("not an output file (bad header)")
    specs = []
    for item in header["outputs"]:
        dtype = getattr(torch, item.get("dtype"), None) if isinstance(item, dict) and isinstance(item.get("dtype"), str) else None
        shape = item.get("shape") if isinstance(item, dict) else None
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or \
                not all(type(n) is int and 0 <= n < 1 << 48 for n in shape):
            raise ValueError(f"not an output file (a bad output description: {json.dumps(item)[:100]})")
        specs.append((dtype, shape))
    if not header["sequence"] and len(specs) != 1:
        raise ValueError("not an output file (a single output described as several)")
    return header["sequence"], specs


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as a writable byte buffer (no numpy needed); the caller
    keeps the tensor alive while it uses the buffer."""
    return memoryview((ctypes.c_char * t.nbytes).from_address(t.data_ptr())).cast("B")


def _write_all(handle, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[handle.write(view):]


def _read_exactly(handle, size: int) -> bytes:
    data = handle.read(size)
    if data is None or len(data) != size:
        raise ValueError("not an output file (truncated)")
    return data


def _read_into(handle, raw: torch.Tensor) -> None:
    view, done = _bytes_of(raw), 0
    while done < len(view):  # one read returns at most 2 GiB
        got = handle.readinto(view[done:])
        if not got:
            raise ValueError("not an output file (truncated)")
        done += got


def _init_inputs(path: str):
    """The reference's init inputs as plain data (tensors, numbers, strings, dtypes...), or None."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        return None


def _streamed_seeds(req: dict):
    """The timed calls' seeds: those in the request, then, up to ``calls`` in all, one a line on
    stdin, which the parent writes only once the call before has ended (see time_calls)."""
    yield from req["seeds"]
    for _ in range(req.get("calls", len(req["seeds"])) - len(req["seeds"])):
        line = sys.stdin.readline()
        if not line:
            raise EOFError("the harness closed the command stream during timing")
        yield int(json.loads(line)["seed"])


def _copies(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _max_diff(a: list, b: list) -> float:
    """Largest elementwise difference between two output lists (inf where shapes, dtypes or NaN positions
    differ). Works in the outputs' own precision (float32 at least), so gigabyte outputs are not doubled."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return float("inf")
        if x.shape != y.shape or x.dtype != y.dtype:
            return float("inf")
        if x.numel() == 0:
            continue
        x, y = x.detach(), y.detach()
        if x.is_floating_point() or x.is_complex():
            if not torch.equal(torch.isnan(x), torch.isnan(y)):
                return float("inf")
            diff = (x - y).abs() if x.is_complex() else (x.float() - y.float()).abs()
            diff = torch.where(torch.isnan(diff), 0.0, diff)  # NaN in both, or the same infinity in both
        else:
            diff = (x.long() - y.long()).abs()
        worst = max(worst, float(diff.max()))
    return worst


def _finite_range(t: torch.Tensor) -> tuple[float, float] | None:
    """(min, max) over the finite elements (the real part of complex ones), or None if there are none."""
    values = (t.real if t.is_complex() else t).detach()
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    if values.is_floating_point() and not bool(torch.isfinite(values).all()):
        values = values[torch.isfinite(values)]  # a copy, only where something is not finite
    if values.numel() == 0:
        return None
    low, high = torch.aminmax(values)
    return float(low), float(high)


def _spread(t: torch.Tensor) -> float:
    """max - min over the finite elements (0 for none): zero means a constant output."""
    found = _finite_range(t)
    return found[1] - found[0] if found else 0.0


def _scale(outputs: list) -> float:
    """Largest finite magnitude among the outputs (the scale a relative tolerance refers to)."""
    scale = 0.0
    for t in outputs:
        found = _finite_range(t) if isinstance(t, torch.Tensor) else None
        if found:
            scale = max(scale, abs(found[0]), abs(found[1]))
    return scale


def _trimmed(stage: str, exc: BaseException, snapshot: Path | None) -> str:
    """The exception, with the traceback trimmed to the candidate's own files."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "site-packages" not in f.filename and "/evaluators/" not in f.filename and "runner.py" not in f.filename]
    lines = [f"  {Path(f.filename).name}:{f.lineno} in {f.name}: {f.line or ''}".rstrip() for f in own[-5:]]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if len(message) > 3000:
        message = message[:1500] + "\n[...]\n" + message[-1500:]
    return f"{stage} raised {message}" + ("\n" + "\n".join(lines) if lines else "")


def main(role: str) -> None:
    channel = Channel(bytes.fromhex(sys.stdin.readline().strip()))
    runner = Runner(channel)
    # The commands and the way to answer, bound before any code under test is imported: a class
    # method the candidate replaces later (Runner.cmd_cand_integrity, Channel.reply) is not the
    # one that runs, and the integrity check, which still runs, names the replacement.
    own = "cmd_ref_" if role == "reference" else "cmd_cand_"  # and the shared ones (setup)
    commands = {name.removeprefix("cmd_"): fn for name, fn in vars(Runner).items()
                if name.startswith(own) or (name.startswith("cmd_") and not name.startswith(("cmd_ref_", "cmd_cand_")))}
    settle, reply, trimmed = Runner.settle, channel.reply, _trimmed
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.pop("cmd")
        handler = commands.get(cmd)
        try:
            if handler is None:
                raise ValueError(f"unknown command {cmd}")
            answer = handler(runner, req)
            settle(runner)
            reply(ok=True, **answer)
        except BaseException as exc:  # the child's job is to report, the parent decides
            reply(ok=False, error=trimmed(cmd, exc, None), kind=type(exc).__name__)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise ValueError(f"unknown command {cmd}")
            answer = handler(req)
            runner.settle()
            channel.reply(ok=True, **answer)
        except BaseException as exc:  # the child's job is to report, the parent decides
            channel.reply(ok=False, error=_trimmed(cmd, exc, None), kind=type(exc).__name__)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
