"""The trusted harness: one evaluation job from snapshot to EvalResult (the script; ``job.py`` holds
the mechanics it runs on: children, lease, bounds, faults).

A job runs isolated processes (``child/``): the **judge**, which runs only the task's code and the
harness's, and a **worker** per model under test: the candidate's ModelNew. The judge makes every
call's inputs under a secret seed, runs the reference, hands the inputs to the worker only as the call
starts, reads the worker's outputs itself and compares them in full, and times the call on its
own clock (``child/judge.py``). The reward depends on nothing else: what the worker reports
(where its outputs are, what its audit saw) can name memory for the judge to read or add a
violation, never raise a reward. The eager and torch.compile baselines are timed in the judge's own
process; the candidate's time is eager's plus the difference between its calls and the task's
Model's calls through the same worker process, made before any candidate code existed there (the
yardstick: ``clock.py``; docs/design.md, One call, and the clock).

This process never imports candidate code and never reads a candidate's output. It applies the
source and module rules before anything runs (``static_rules.py``, ``module_rules.py``), turns what
the judge and the workers answer into the result, and concludes it (``verdict.py``), the one place a
reward is decided.

Why one module: the job's steps are one script read top to bottom (``_Script``), and what the
result's guarantees rest on (nothing of the candidate's runs before the yardstick, every timed call
judged) is its order, which must be seen whole.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernel_env.evaluators import clock, floor
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.child.protocol import (
    BandwidthAnswer,
    CallRecord,
    Connect,
    Drive,
    DriveAnswer,
    Findings,
    Integrity,
    IntegrityAnswer,
    Load,
    LoadAnswer,
    RefBandwidth,
    RefInit,
    RefTime,
    RefTimeAnswer,
    RefTrials,
    RefTrialsAnswer,
    ServeAnswer,
    Setup,
    SetupAnswer,
)
from kernel_env.evaluators.children import Child, ChildError, CommandFailed
from kernel_env.evaluators.job import SPARES, Job, JobFailed, lost_with_its_server
from kernel_env.evaluators.module_rules import read_untrusted
from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode, Timing, TrialReport
from kernel_env.evaluators.reward import close_calls
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.evaluators.static_rules import check_sources
from kernel_env.evaluators.verdict import conclude

_PROCESSES_MESSAGE = ("ModelNew started other processes, {when} ({pids} in the evaluation sandbox); kernels must "
                      "run in the evaluated process")
#: A candidate's job folder holds at most this floor + this multiple of what it must hold (the
#: reference's weights and init inputs, the snapshot), in this many files.
_JOB_FOLDER_FLOOR = 1 << 30
_JOB_FOLDER_MULTIPLE = 4
_JOB_FOLDER_FILES = 10_000

def evaluate(job: EvalJob, *, device: str | None = None, baselines: BaselineCache | None = None,
             lease: DeviceLease | None = None,
             answer: Callable[[EvalResult], None] | None = None) -> EvalResult:
    """Evaluate one job on ``device`` (``cuda:N`` or ``cpu``); every failure becomes a result.

    ``lease``: the device's, when other jobs run on it at once (sharing.py): the job's timing runs
    then wait for the device to themselves, and its other steps for no timing run. Without one
    the caller guarantees that nothing else uses the device.

    ``answer``: called with the result as soon as it is complete, before the job's processes are
    ended (0.2-0.3 s on an H100 machine, where each has a CUDA context to tear down): the pool
    answers the job with it, so the caller does not wait for the clean-up. ``evaluate`` itself
    returns once the processes are gone; with ``answer``, their ending is left out of
    ``steps_s`` and ``duration_s``."""
    started = time.monotonic()
    device = device or ("cuda:0" if job.device == "cuda" else "cpu")
    result = EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                        ran_on=f"{socket.gethostname()}/{device}", mode=job.mode, snapshot_hash=job.snapshot_hash,
                        atol=job.settings.atol, rtol=job.settings.rtol, speedup_margin=job.settings.speedup_margin)
    jb = Job(job, result, device, lease)
    try:
        try:
            _Script(jb, baselines or BaselineCache()).run()
        except JobFailed:
            pass
        if answer is not None:
            answer(_concluded(result, job, started))
    finally:
        jb.finish(record=answer is None)
    return result if answer is not None else _concluded(result, job, started)


def _concluded(result: EvalResult, job: EvalJob, started: float) -> EvalResult:
    conclude(result, job.settings.speedup_margin)
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def measure_baselines(task_id: str, task_code: str, *, device: str = "cpu", baselines: BaselineCache | None = None,
                      settings: EvalSettings | None = None) -> EvalResult:
    """Time one task's baselines (eager, and torch.compile unless the settings leave it out) in a
    judge's own process; the compiled time is cached (``baselines.py``). On the CPU a job holds a
    candidate against eager in its worker instead (``clock.through_worker``), which no judge alone
    can time: the eager time here is the judge's.

    Returns an EvalResult carrying only ``eager``/``compiled_baseline`` (or ``error``)."""
    job = EvalJob(job_id="baseline", task_id=task_id, task_code=task_code, language="cpp", device=device.split(":")[0],
                  mode=Mode.PROFILE, snapshot_dir=Path("/nonexistent"), settings=settings or EvalSettings())
    result = EvalResult(job_id=job.job_id, task_id=task_id, language="-", device=job.device, mode=Mode.PROFILE)
    jb = Job(job, result, device if ":" in device or device == "cpu" else f"{device}:0")
    script = _Script(jb, baselines or BaselineCache())
    try:
        setup = script.run_reference(trials=False)
        script.cached_compile(setup)
        result.eager = clock.local(script.time_locally("judge: eager timing", ["eager"])["eager"])
        result.compiled_baseline = script.compiled_at(result.eager)
    except JobFailed:
        pass
    finally:
        jb.finish()
    return result


def reserve_spares(per_role: int) -> None:
    """Keep at least ``per_role`` spare children ready per role and device (as many as jobs run at once on one)."""
    SPARES.depth = max(SPARES.depth, per_role)


class _Script:
    """The job's steps, in order: what the guarantees in the module's docstring rest on reads top to bottom."""

    def __init__(self, jb: Job, baselines: BaselineCache):
        self.jb, self.baselines = jb, baselines
        self.job, self.result, self.s = jb.job, jb.result, jb.s
        self.init_seed = secrets.randbits(31)
        #: torch.compile's time and eager's timed beside it (``cached_compile``)
        self.compile_pair: tuple[Timing, Timing] | None = None
        #: the Model's calls through the candidate's worker, and the judge's own beside them (``yardstick``)
        self.yardstick_calls: tuple[list[float], list[float]] | None = None
        #: the most bytes per millisecond the device was measured to move (``device_bandwidth``)
        self.bytes_per_ms: float | None = None

    def run(self) -> None:
        jb, snapshot = self.jb, self.job.snapshot_dir
        if not (snapshot / "model_new.py").is_file():
            jb.fail("the workspace has no model_new.py", compiled=False, fault="candidate")
        foreign = _foreign_build(snapshot)
        if foreign:
            jb.fail(foreign, compiled=False, fault="candidate")
        broken = check_sources(snapshot)
        if broken:
            self.result.violations += broken
            jb.fail("the sources break the skill's rules (see the violations); nothing was run", fault="candidate")
        setup = self.run_reference(trials=True)
        if jb.timed:
            self.cached_compile(setup)
            self.device_bandwidth(setup)
        self.run_candidate()

    # ------------------------------------------------------------------ the reference (the judge)

    def run_reference(self, *, trials: bool) -> SetupAnswer:
        """The judge's own steps: the task, the Model under the job's seed, and its trials' outputs,
        which it keeps in its memory. A failure here is the task's, never the candidate's."""
        jb = self.jb
        judge = self.judge = jb.child("judge")
        self.ref_dir = judge.host_paths["/job/ref"]
        setup = jb.ask(judge, Setup(device=jb.child_device, out_dir=judge.path("/job/ref"), task_code=self.job.task_code),
                       SetupAnswer, "running the reference task")
        self.result.device_name = setup.device_name
        jb.ask(judge, RefInit(init_seed=self.init_seed), None, "building the reference Model")
        if not trials:
            return setup
        screened = hashlib.sha256(repr((self.job.task_code, jb.gpu, self.s.atol, self.s.rtol, self.s.vary_inputs,
                                        self.s.trials)).encode()).hexdigest()
        # A task searched for trivial answers and found to have none (a task's property, not a job's) is
        # remembered beside the baselines: later jobs skip the search (0.3 s of a GPU job's reference,
        # seconds on a CPU). A task's outputs are still checked to be finite in every job.
        screen = self.s.refuse_trivial_tasks and not self.baselines.screened(screened)
        answer = jb.ask(judge, RefTrials(seeds=[secrets.randbits(31) for _ in range(self.s.trials)], vary=self.s.vary_inputs,
                                         atol=self.s.atol, rtol=self.s.rtol, screen=screen),
                        RefTrialsAnswer, "running the reference Model")
        if answer.error:
            jb.fail(f"the task cannot be evaluated: {answer.error}; not your code's fault", fault="evaluator")
        odd = [kind for trial in answer.trials for kind in trial.non_tensor_outputs]
        if odd:
            jb.fail(f"the task cannot be evaluated: its Model returns {', '.join(odd[:3])}, not tensors (an output must be a "
                    "tensor, or a tuple or list of them); not your code's fault", fault="evaluator")
        if answer.trivial and self.s.refuse_trivial_tasks:
            jb.fail(f"the task cannot be evaluated: {'; '.join(answer.trivial)} (screened at the evaluator's tolerance: "
                    "a constant or copied answer would be paid as correct); not your code's fault. `kernel-env tasks "
                    "--check` lists such tasks", fault="evaluator")
        if screen:
            self.baselines.mark_screened(screened)
        self.reference = answer
        return setup

    # ------------------------------------------------------------------ the baselines (the judge's own process)

    def cached_compile(self, setup: SetupAnswer) -> None:
        """torch.compile's time with the eager time timed beside it, from the cache or timed now in the
        judge's process (compiled first, outside the timing run: a compile is seconds of processor)."""
        if not self.s.compile_baseline:
            return
        key = self.baselines.key(self.job.task_code, setup.device_name, setup.torch, self.s.timing_protocol())
        cached = self.baselines.get(key)
        if cached is None or cached[1] is None:
            self.time_locally("judge: compile the baseline", ["compile"], calls=0)
            times = self.time_locally("judge: baselines timing", ["eager", "compile"])
            cached = self.baselines.put(key, clock.local(times["eager"]), clock.local(times["compile"]))
        self.compile_pair = cached

    def compiled_at(self, eager: Timing) -> Timing | None:
        """torch.compile's cached time at this job's pace: scaled by this job's eager time over the eager
        time cached beside it."""
        if self.compile_pair is None:
            return None
        cached_eager, compiled = self.compile_pair
        return clock.scaled(compiled, eager.median_ms / cached_eager.median_ms)

    def device_bandwidth(self, setup: SetupAnswer) -> None:
        """The most bytes per millisecond the device was measured to move, the physical floor's divisor
        (``floor.py``): cached per device; where the cache has none, measured now in the judge's
        process, as a timing run (the device, or the processor, to itself: every other job frozen)."""
        jb = self.jb
        device = setup.device_name if jb.gpu else f"cpu on {socket.gethostname()}"
        cache = floor.BandwidthCache(self.baselines.directory)
        self.bytes_per_ms = cache.get(device)
        if self.bytes_per_ms is not None:
            return

        def run() -> float:
            try:
                return self.judge.call(RefBandwidth(flush_bytes=self._flush_bytes()), BandwidthAnswer,
                                       self.s.step_timeout_s, yields=False).bytes_per_ms
            except (ChildError, CommandFailed) as exc:
                jb.fail(f"measuring the device's memory bandwidth failed: {exc}; not your code's fault",
                        log=self.judge.log_tail(), fault="evaluator")

        self.bytes_per_ms = cache.put(device, jb.timing_step(self.judge, "judge: bandwidth", run))

    def time_locally(self, name: str, models: list[str], *, calls: int | None = None) -> dict[str, list[float]]:
        """The judge's own calls of ``models`` (``RefTime``); a timing run unless ``calls=0`` (warm-up only)."""
        jb, s = self.jb, self.s
        command = RefTime(calls=s.timed_calls if calls is None else calls, warmup=s.warmup_calls if calls == 0 else 1,
                          flush_bytes=self._flush_bytes(), models=models)

        def run() -> dict[str, list[float]]:
            try:
                return self.judge.call(command, RefTimeAnswer, s.job_timeout_s, yields=calls == 0).times_ms
            except (ChildError, CommandFailed) as exc:
                jb.fail(f"timing the task's baselines ({', '.join(models)}) failed: {exc}; not your code's fault",
                        log=self.judge.log_tail(), fault="evaluator")

        return _in_step(jb, name, run) if calls == 0 else jb.timing_step(self.judge, name, run)

    def start_worker(self, label: str) -> Child:
        """A worker connected to the judge, with the reference's weights and init inputs, and for a timed
        job the yardstick (``yardstick``): all before any candidate file reaches it."""
        jb = self.jb
        worker = jb.child("worker")
        jb.ask(worker, Setup(device=jb.child_device, out_dir=worker.path("/job/cand"), task_code=self.job.task_code,
                             pid_namespace=worker.isolated), None, f"starting the {label} process")
        with jb.step(f"{label}: connect", share=None):
            try:
                self.judge.connect(worker)
            except ChildError as exc:
                jb.fail(f"connecting the {label} to the judge failed: {exc}")
        jb.ask(self.judge, Connect(), None, f"connecting the {label} to the judge")
        jb.ask(worker, Connect(), None, f"connecting the {label} to the judge")
        work_dir = worker.host_paths["/job/cand"]
        with jb.step(f"{label}: copy files", share=None):
            for name in ("init_inputs.pt", "state_dict.pt"):
                shutil.copy2(self.ref_dir / name, work_dir / name)
        if jb.timed:
            self.yardstick(worker, label)
        return worker

    def yardstick(self, worker: Child, label: str) -> None:
        """The task's Model through ``worker``, timed as the candidate will be, before any candidate code
        exists there, with the judge's own calls of it beside (this job's eager time): the candidate's
        time is eager's plus the difference through the one process (``clock.relative``), in which the
        round trip, whatever its size in this process, cancels."""
        jb, s = self.jb, self.s
        loaded = jb.ask(worker, self.load(worker, "eager"), LoadAnswer, f"building the task's Model in the {label} process")
        if loaded.error:
            jb.fail(f"the task's Model could not be built in the {label} process: {loaded.error}; not your code's fault",
                    fault="evaluator")
        self.calls(worker, Drive(phase="warmup", calls=s.warmup_calls, flush_bytes=self._flush_bytes()),
                   f"{label}: yardstick warm-up", s.step_timeout_s)
        driven, _ = self.calls(worker, Drive(phase="time", calls=s.timed_calls, flush_bytes=self._flush_bytes(),
                                             own_share=not jb.gpu), f"{label}: yardstick", s.job_timeout_s, timing=True)
        self.yardstick_calls = _times(driven.calls, "timed"), _times(driven.calls, "local")
        # On a GPU eager's own time in the judge's process; on the CPU, where a model's speed depends on its
        # process, eager's in this worker: the yardstick less the judge's own share (``clock.through_worker``).
        self.result.eager = clock.local(self.yardstick_calls[1]) if jb.gpu else \
            clock.through_worker(self.yardstick_calls[0], _times(driven.calls, "share"))
        self.result.compiled_baseline = self.compiled_at(self.result.eager)
        self.result.physical_floor_ms = floor.floor_ms(self.reference.call_bytes, self.bytes_per_ms, self.result.eager)

    def load(self, worker: Child, kind: str) -> Load:
        work_dir = worker.path("/job/cand")
        return Load(kind=kind, init_inputs=f"{work_dir}/init_inputs.pt", state_dict=f"{work_dir}/state_dict.pt",
                    init_seed=self.init_seed, snapshot=worker.path("/job/snapshot"), language=self.jb.language.name)

    def calls(self, worker: Child, drive: Drive, name: str, timeout: float, *, timing: bool = False,
              then: Callable[[DriveAnswer, ServeAnswer], Drive | None] | None = None) -> tuple[DriveAnswer, ServeAnswer]:
        """One phase of calls between the judge and ``worker``; ends the job where it broke off. Once
        the candidate is in the worker, whatever stops the calls is its fault (it could cause any of
        it), but a fork server's end. ``then``: given each phase's answers, the next phase to run in
        the same step (a timing run's further calls, with the device still held), or None; returns
        the last phase's answers."""
        jb = self.jb
        doing = "running ModelNew" if jb.candidate_exposed else f"{name}"

        def phase(drive: Drive) -> tuple[DriveAnswer, ServeAnswer]:
            try:
                driven, served = jb.converse(self.judge, worker, drive, timeout, yields=not timing)
            except ChildError as exc:
                lost = lost_with_its_server(worker) or lost_with_its_server(self.judge)
                if "took longer than" in str(exc) and jb.candidate_exposed:
                    exc = ChildError(f"ModelNew ({drive.phase}) took longer than {timeout:.0f}s and was killed "
                                     "(a hang, a deadlock or an endless loop?)")
                jb.fail(f"{doing} failed: {exc}", log=worker.log_tail(), fault=lost)
            except CommandFailed as exc:
                jb.fail(f"{doing} failed: {exc}", log=worker.log_tail())
            if driven.worker_error:
                jb.fail(driven.worker_error, log=worker.log_tail())
            if driven.error:
                jb.fail(f"{doing} failed: {driven.error}", log=worker.log_tail())
            return driven, served

        def run() -> tuple[DriveAnswer, ServeAnswer]:
            answers = phase(drive)
            while then is not None and (following := then(*answers)) is not None:
                answers = phase(following)
            return answers

        return jb.timing_step(self.judge, name, run) if timing else _in_step(jb, name, run)

    def _flush_bytes(self) -> int:
        """The cache flush before each call: the settings' on a GPU; on the CPU at most 32 MiB, written
        by one thread (an L3 holds less)."""
        return self.s.flush_bytes if self.jb.gpu else min(self.s.flush_bytes, 32 << 20)

    # ------------------------------------------------------------------ the candidate (a worker)

    def run_candidate(self) -> None:
        jb, s, result = self.jb, self.s, self.result
        worker = self.start_worker("candidate")
        cand_dir = worker.host_paths["/job/cand"]
        with jb.step("candidate: copy files", share=None):
            # The snapshot is the broker's copy (regular files only); the worker sees this copy read-only.
            shutil.copytree(self.job.snapshot_dir, worker.host_paths["/job/snapshot"], symlinks=True, dirs_exist_ok=True)
        jb.candidate_exposed = True
        # Room for a few times what it must hold (the weights and init inputs): a candidate filling the
        # host's disk is ended, as its own fault.
        worker.quota = (_JOB_FOLDER_FLOOR + _JOB_FOLDER_MULTIPLE * _folder_bytes(cand_dir), _JOB_FOLDER_FILES)
        # On a GPU the load ends with a first forward (worker.Worker._first_forward): a trial's worth.
        per_trial = result.steps_s.get("judge: RefTrials", 0.0) / max(1, s.trials)
        loaded = jb.ask(worker, self.load(worker, "candidate"), LoadAnswer, "loading ModelNew",
                        timeout=jb.bound("judge: Setup", "judge: RefInit", per_trial))
        if loaded.error:
            jb.fail(loaded.error, log=worker.log_tail())
        if loaded.shape_mismatch:
            result.violations.append(f"weights with the reference's names but other shapes: {', '.join(loaded.shape_mismatch[:5])}")
        trials, served = self.calls(worker, Drive(phase="trials", atol=s.atol, rtol=s.rtol, flush_bytes=self._flush_bytes()),
                                    "candidate: trials", jb.bound("judge: RefTrials"))
        self.check_trials(trials.calls)
        self.check_beside(served, "running the trials")
        if jb.timed and result.correct and not result.violations:
            self.time_candidate(worker)
        integrity = jb.ask(worker, Integrity(), IntegrityAnswer, "checking the candidate process")
        result.violations += [f"ModelNew changed the harness: {c}" for c in integrity.changes]
        if integrity.new_threads:
            result.violations.append(f"ModelNew left threads running ({', '.join(integrity.new_threads[:3])}); work must finish inside forward")
        if integrity.processes:
            result.violations.append(_PROCESSES_MESSAGE.format(when="left behind", pids=", ".join(integrity.processes[:5])))
        if integrity.modes:
            result.violations.append(f"ModelNew left torch modes on the stack ({', '.join(integrity.modes[:3])})")
        result.violations = list(dict.fromkeys(result.violations))

    def check_trials(self, calls: list[CallRecord]) -> None:
        s, result = self.s, self.result
        for index, call in enumerate(calls):
            verdict = call.verdict
            result.trials.append(TrialReport(**verdict.__dict__))
            if call.mutated_inputs and not self.reference.trials[index].mutated_inputs:
                result.violations.append("ModelNew.forward modified its input tensors in place (the reference does not)")
            self.check_rules([call.findings], when="")
            if not verdict.correct or result.violations:
                break
        result.violations = list(dict.fromkeys(result.violations))
        result.correct = bool(result.trials) and all(t.correct for t in result.trials) and len(result.trials) == s.trials

    def check_rules(self, findings: list[Findings | None], *, when: str) -> None:
        """Rule violations seen by the audit, which every call of a candidate's runs under."""
        result = self.result
        suffix = f" ({when})" if when else ""
        for found in findings:
            if found is None or not found.audited:
                result.violations.append(f"a call's findings were not reported{suffix}: the audit was interfered with")
                continue
            if found.torch_ops and self.s.own_kernels_only:
                ops = ", ".join(f"{name} x{count}" for name, count in sorted(found.torch_ops.items())[:8])
                result.violations.append(f"torch computes inside ModelNew.forward{suffix} ({ops}); all compute must be in your own kernels")
            if (self.jb.language.name == "triton" and self.s.own_kernels_only and found.triton_launches == 0
                    and not found.empty_output):
                result.violations.append(f"ModelNew.forward launched no Triton kernel{suffix}; compute must happen in Triton kernels")
        result.violations = list(dict.fromkeys(result.violations))

    def check_beside(self, served: ServeAnswer, when: str) -> None:
        """What the worker saw beside its calls: other processes, threads, modes left on torch's stack."""
        result = self.result
        if served.processes:
            result.violations.append(_PROCESSES_MESSAGE.format(when=when, pids=", ".join(served.processes[:5])))
        if served.threads:
            result.violations.append(f"ModelNew had threads running beside its calls ({', '.join(served.threads[:3])}) "
                                     f"while {when}; work must finish inside forward")
        if served.modes:
            result.violations.append(f"ModelNew left torch modes on the stack after a call ({', '.join(served.modes[:3])}) "
                                     f"while {when}: a mode could compute an output when it is read")
        if result.violations:
            result.correct = False

    def time_candidate(self, worker: Child) -> None:
        """Warm-up, then the timing run (every call compared in full and audited): while a milestone lies
        within the measurement's noise (``reward.close_calls``), more calls in the same run, pooled with
        the earlier ones, up to ``timing_runs`` times the timed calls in all."""
        s, jb, result = self.s, self.jb, self.result
        per_trial = result.steps_s.get("judge: RefTrials", 0.0) / max(1, s.trials)
        warmed, _ = self.calls(worker, Drive(phase="warmup", calls=s.warmup_calls, flush_bytes=self._flush_bytes()),
                               "candidate: warm-up", jb.bound(per_trial * s.warmup_calls, cap=s.job_timeout_s))
        per_call = result.steps_s.get("candidate: warm-up", 0.0) / max(1, s.warmup_calls)
        times: list[float] = []
        beside: list[float] = []
        audited: list[Findings | None] = [r.findings for r in warmed.calls]

        def drive() -> Drive:
            return Drive(phase="time", calls=s.timed_calls, checked=s.timed_calls, atol=s.atol, rtol=s.rtol,
                         flush_bytes=self._flush_bytes())

        def then(driven: DriveAnswer, served: ServeAnswer) -> Drive | None:
            wrong = next((r for r in driven.calls if r.verdict is not None and not r.verdict.correct), None)
            if wrong is not None:
                index = sum(1 for r in driven.calls[:driven.calls.index(wrong)] if r.kind == wrong.kind)
                result.violations.append(f"timed call {index} returned a wrong result (the output of a timed call "
                                         f"must be correct too): {wrong.verdict.message}")
                return None
            self.check_beside(served, "timing")
            run_times = _times(driven.calls, "timed")
            if len(run_times) != s.timed_calls:
                result.violations.append("the timing run did not make every call (the call protocol was interfered with)")
            audited.extend(r.findings for r in driven.calls if r.kind == "timed")
            times.extend(run_times)
            beside.extend(_times(driven.calls, "local"))
            if result.violations:
                return None
            result.runtime = clock.relative(result.eager, *self.yardstick_calls, times, beside)
            more = len(times) < s.timing_runs * s.timed_calls and close_calls(result)
            return drive() if more else None

        self.calls(worker, drive(), "candidate: timing", jb.bound(per_call * s.timing_runs * s.timed_calls,
                   cap=s.job_timeout_s, floor=s.timing_floor_s), timing=True, then=then)
        self.check_rules(audited, when="during timing")
        if floor.surely_below(result.runtime, result.physical_floor_ms):
            result.violations.append(floor.message(result.runtime, result.physical_floor_ms, self.reference.call_bytes,
                                                   self.bytes_per_ms))
        if result.violations:
            result.correct, result.runtime = False, None


def _in_step(jb: Job, name: str, run: Callable):
    with jb.step(name):
        return run()


def _times(calls: list[CallRecord], kind: str) -> list[float]:
    return [r.time_ms for r in calls if r.kind == kind]


def _folder_bytes(folder: Path) -> int:
    return sum(path.lstat().st_blocks * 512 for path in folder.rglob("*"))


def _foreign_build(snapshot: Path) -> str | None:
    """Why the snapshot's built module cannot load here (built against another torch), or None.

    Reads what the build wrote (build/build_info.json); it comes from the sandbox, so it only
    turns an obscure import failure into a clear message and decides nothing else."""
    if not list((snapshot / "build").glob("cuda_extension*.so")):
        return None
    try:
        built_with = json.loads(read_untrusted(snapshot / "build" / "build_info.json", 1 << 20)).get("torch")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(built_with, str) and built_with != torch.__version__:
        return (f"build/ holds a module built against torch {built_with[:40]}, but this GPU worker runs torch "
                f"{torch.__version__}: an extension only loads into the torch it was built with. Build with the "
                f"worker's torch (its sandbox image) and evaluate again")
    return None
