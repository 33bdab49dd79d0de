"""The trusted harness: one evaluation job from snapshot to EvalResult (the script; ``job.py`` holds
the mechanics it runs on: children, lease, bounds, faults).

A job runs isolated processes (``child/``): the **judge**, which runs only the task's code and the
harness's, and a **worker** per model under test: the candidate's ModelNew. The judge makes every
call's inputs under a secret seed, runs the reference, hands the inputs to the worker only as the call
starts, reads the worker's outputs itself and compares them in full, and times the call on its
own clock (``child/judge.py``). The reward depends on nothing else: what the worker reports
(where its outputs are, what its audit saw) can name memory for the judge to read or add a
violation, never raise a reward. The eager and torch.compile baselines are timed the same way,
through a worker that runs the task's Model, so the round trip's fixed cost is the same for all
three and is calibrated out of each (docs/design.md, The trusted evaluation).

This process never imports candidate code and never reads a candidate's output. It applies the
source and module rules before anything runs (``static_rules.py``, ``module_rules.py``), turns what
the judge and the workers answer into the result, and concludes it (``verdict.py``), the one place a
reward is decided.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernel_env.evaluators.baselines import BaselineCache, faster_of
from kernel_env.evaluators.child.protocol import (
    CallRecord,
    Connect,
    Drive,
    DriveAnswer,
    Findings,
    Integrity,
    IntegrityAnswer,
    Load,
    LoadAnswer,
    RefInit,
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
from kernel_env.evaluators.reward import faster
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
#: The tasks this process has screened for trivial answers and found none that passes (a task's
#: property, not a job's): later jobs of the same task skip the search (0.3 s of a GPU job's
#: reference). A task's outputs are still checked to be finite in every job.
_SCREENED: set[str] = set()


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
    """Fill the baseline cache for one task (eager and torch.compile, the candidates' protocol).

    Returns an EvalResult carrying only ``eager``/``compiled_baseline`` (or ``error``)."""
    job = EvalJob(job_id="baseline", task_id=task_id, task_code=task_code, language="cpp", device=device.split(":")[0],
                  mode=Mode.PROFILE, snapshot_dir=Path("/nonexistent"), settings=settings or EvalSettings())
    result = EvalResult(job_id=job.job_id, task_id=task_id, language="-", device=job.device, mode=Mode.PROFILE)
    jb = Job(job, result, device if ":" in device or device == "cpu" else f"{device}:0")
    script = _Script(jb, baselines or BaselineCache())
    try:
        setup = script.run_reference(trials=False)
        result.eager, result.compiled_baseline = script.baseline_times(setup)
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
            self.result.eager, self.result.compiled_baseline = self.baseline_times(setup)
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
        screen = self.s.refuse_trivial_tasks and screened not in _SCREENED
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
            _SCREENED.add(screened)
        self.reference = answer
        return setup

    def baseline_times(self, setup: SetupAnswer) -> tuple[Timing, Timing | None]:
        """Eager and torch.compile, timed as candidates are (a worker running the task's Model), or the cache's."""
        self.baseline_key = self.baselines.key(self.job.task_code, setup.device_name, setup.torch, self.s.timing_protocol())
        cached = self.baselines.get(self.baseline_key)
        # An entry measured without the compile baseline does not serve a job that wants one.
        if cached and (cached[1] is not None or not self.s.compile_baseline):
            return cached
        timed = self.time_baselines("baseline worker", ("eager", "compile") if self.s.compile_baseline else ("eager",))
        return self.baselines.put(self.baseline_key, timed["eager"], timed.get("compile"))

    def time_baselines(self, label: str, kinds: tuple[str, ...]) -> dict[str, Timing]:
        jb = self.jb
        worker = self.start_worker(label)
        timings = {}
        for kind in kinds:
            loaded = jb.ask(worker, self.load(worker, kind), LoadAnswer, f"building the {kind} baseline",
                            timeout=self.s.job_timeout_s)
            if loaded.error:
                jb.fail(f"the {kind} baseline could not be built: {loaded.error}")
            self.calls(worker, Drive(phase="warmup", calls=self.s.warmup_calls, flush_bytes=self._flush_bytes()),
                       f"{label}: {kind} warm-up", self.s.job_timeout_s)
            driven, _ = self.calls(worker, Drive(phase="time", calls=self.s.timed_calls, flush_bytes=self._flush_bytes()),
                                   f"{label}: {kind} timing", self.s.job_timeout_s, timing=True)
            timings[kind] = _timing([r.time_ms for r in driven.calls if r.kind == "timed"], driven.calibration_ms)
        jb.discard(worker)
        return timings

    def confirm_speedup(self, candidate: Child) -> None:
        """A speed-up is paid only against baselines timed again after the candidate's, once its
        process is gone: each baseline the candidate seems faster than by the margin is the faster
        of its first timing (cached, or timed before the candidate) and a new one, and the cache
        keeps that one. A disturbance (a busy processor, another process's work on the device) only
        ever makes a timing slower, so a baseline timed during one pays no speed-up, once or for good."""
        result, margin = self.result, self.s.speedup_margin
        claimed = tuple(kind for kind, baseline_ms in (("eager", result.eager_ms), ("compile", result.compile_ms))
                        if faster(result.runtime_ms, baseline_ms, margin))
        if not claimed:
            return
        self.jb.discard(candidate)
        # A failure from here on is the evaluator's: it would pay the candidate nothing, not its milestone.
        self.jb.candidate_exposed = False
        timed = self.time_baselines("baseline worker (confirming a speed-up)", claimed)
        result.eager, result.compiled_baseline = self.baselines.put(
            self.baseline_key, faster_of(result.eager, timed.get("eager")),
            faster_of(result.compiled_baseline, timed.get("compile")))

    def start_worker(self, label: str) -> Child:
        """A worker connected to the judge, with the reference's weights and init inputs, and the
        round trip calibrated (for a timed job): all before any candidate file reaches it."""
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
            self.calls(worker, Drive(phase="calibrate", calls=self.s.calibration_calls, flush_bytes=self._flush_bytes()),
                       f"{label}: calibrate", self.s.step_timeout_s, timing=True)
        return worker

    def load(self, worker: Child, kind: str) -> Load:
        work_dir = worker.path("/job/cand")
        return Load(kind=kind, init_inputs=f"{work_dir}/init_inputs.pt", state_dict=f"{work_dir}/state_dict.pt",
                    init_seed=self.init_seed, snapshot=worker.path("/job/snapshot"), language=self.jb.language.name)

    def calls(self, worker: Child, drive: Drive, name: str, timeout: float, *, timing: bool = False
              ) -> tuple[DriveAnswer, ServeAnswer]:
        """One phase of calls between the judge and ``worker``; ends the job where it broke off. Once
        the candidate is in the worker, whatever stops the calls is its fault (it could cause any of
        it), but a fork server's end."""
        jb = self.jb
        doing = "running ModelNew" if jb.candidate_exposed else f"{name}"

        def run() -> tuple[DriveAnswer, ServeAnswer]:
            try:
                return jb.converse(self.judge, worker, drive, timeout, yields=not timing)
            except ChildError as exc:
                lost = lost_with_its_server(worker) or lost_with_its_server(self.judge)
                if "took longer than" in str(exc) and jb.candidate_exposed:
                    exc = ChildError(f"ModelNew ({drive.phase}) took longer than {timeout:.0f}s and was killed "
                                     "(a hang, a deadlock or an endless loop?)")
                jb.fail(f"{doing} failed: {exc}", log=worker.log_tail(), fault=lost)
            except CommandFailed as exc:
                jb.fail(f"{doing} failed: {exc}", log=worker.log_tail())

        driven, served = jb.timing_step(self.judge, name, run) if timing else _in_step(jb, name, run)
        if driven.worker_error:
            jb.fail(driven.worker_error, log=worker.log_tail())
        if driven.error:
            jb.fail(f"{doing} failed: {driven.error}", log=worker.log_tail())
        return driven, served

    def _flush_bytes(self) -> int:
        return self.s.flush_bytes

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
        loaded = jb.ask(worker, self.load(worker, "candidate"), LoadAnswer, "loading ModelNew",
                        timeout=jb.bound("judge: Setup", "judge: RefInit"))
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
        if result.runtime is not None and not result.violations:
            self.confirm_speedup(worker)

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
        """Rule violations seen by audited calls (the trials, and secret positions of the timing run)."""
        result = self.result
        suffix = f" ({when})" if when else ""
        for found in findings:
            if found is None or not found.audited:
                result.violations.append(f"an audited call's findings were not reported{suffix}: the audit was interfered with")
                continue
            if found.torch_ops and self.s.own_kernels_only:
                ops = ", ".join(f"{name} x{count}" for name, count in sorted(found.torch_ops.items())[:8])
                result.violations.append(f"torch computes inside ModelNew.forward{suffix} ({ops}); all compute must be in your own kernels")
            if self.jb.language.name == "triton" and found.triton_launches == 0 and not found.empty_output:
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
        s, jb, result = self.s, self.jb, self.result
        per_trial = result.steps_s.get("judge: RefTrials", 0.0) / max(1, s.trials)
        self.calls(worker, Drive(phase="warmup", calls=s.warmup_calls, flush_bytes=self._flush_bytes()), "candidate: warm-up",
                   jb.bound(per_trial * s.warmup_calls, cap=s.job_timeout_s))
        audit_at = sorted(secrets.SystemRandom().sample(range(s.timed_calls), min(s.audited_timed_calls, s.timed_calls)))
        per_call = result.steps_s.get("candidate: warm-up", 0.0) / max(1, s.warmup_calls)
        calls = s.timed_calls + len(audit_at)
        driven, served = self.calls(
            worker, Drive(phase="time", calls=s.timed_calls, audit_at=audit_at, checked=s.timed_calls, atol=s.atol, rtol=s.rtol,
                          flush_bytes=self._flush_bytes()),
            "candidate: timing", jb.bound(per_call * calls, cap=s.job_timeout_s, floor=s.timing_floor_s), timing=True)
        wrong = next((r for r in driven.calls if r.verdict is not None and not r.verdict.correct), None)
        if wrong is not None:
            index = sum(1 for r in driven.calls[:driven.calls.index(wrong)] if r.kind == wrong.kind)
            result.violations.append(f"{'timed' if wrong.kind == 'timed' else 'audited'} call {index} returned a wrong result "
                                     f"(the output of a timed call must be correct too): {wrong.verdict.message}")
            result.correct = False
            return
        self.check_rules([r.findings for r in driven.calls if r.kind == "audited"], when="during timing")
        self.check_beside(served, "timing")
        times = [r.time_ms for r in driven.calls if r.kind == "timed"]
        if len(times) != s.timed_calls or len([r for r in driven.calls if r.kind == "audited"]) != len(audit_at):
            result.violations.append("the timing run did not make every call (the call protocol was interfered with)")
        if result.violations:
            result.correct = False
            return
        result.runtime = _timing(times, driven.calibration_ms)


def _in_step(jb: Job, name: str, run: Callable):
    with jb.step(name):
        return run()


def _timing(times: list[float], round_trip_ms: float | None) -> Timing:
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return Timing(median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times), calls=len(times),
                  p25_ms=quartiles[0], p75_ms=quartiles[2], round_trip_ms=round_trip_ms)


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
