"""The trusted harness: one evaluation job from snapshot to EvalResult.

This module never imports candidate code, and no candidate output is ever read by it. It runs
two isolated child processes (``child/runner.py``, forked by ``children.py``): the reference
process runs the task and keeps the trials' outputs in its own memory (none reaches disk); the
candidate process runs ModelNew on the same seeded weights and the same fresh random inputs and
writes each trial's outputs as raw bytes in its own folder. This process only moves that file
(a rename) into the reference's folder, and the *reference's* process compares it with what it
holds (``child/compare.py``), trusting nothing about the file; so a candidate can neither see
the expected outputs nor forge the verdict. This process checks the candidate's timing against
its own clock and the device record, the outputs of timed calls against the reference's
fingerprints, applies the rules (``static_rules.py`` before anything runs, ``child/guards.py``
while it runs), and records the milestone (``reward.py``), the one place a reward is decided.

Why one module of ~500 lines: every step of a job, and the order between them that the
guarantees above rest on, reads top to bottom here (``evaluate`` → ``_Evaluation.run``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.child.guards import (
    EARLY_WORK_TOLERANCE_US,
    LATE_WORK_TOLERANCE_US,
)
from kernel_env.evaluators.child.timing import (
    COVER_KERNEL,
    END_KERNEL,
    fingerprints_match,
)
from kernel_env.evaluators.children import Child, ChildError, Spares, warm_children
from kernel_env.evaluators.records import (
    EvalJob,
    EvalResult,
    EvalSettings,
    Fault,
    Mode,
    Timing,
    TrialReport,
)
from kernel_env.evaluators.reward import close_calls, milestone_reward
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.evaluators.static_rules import check_sources
from kernel_env.languages import get_language

log = logging.getLogger(__name__)

_PROCESSES_MESSAGE = ("ModelNew started other processes, {when} ({pids} in the evaluation sandbox); kernels must "
                      "run in the evaluated process, where the timing sees them")
# What the kernel's clock may see beyond a timed call's own marks (lower quartile over the calls):
# two socket sends and the scheduler, plus a proportional margin.
_WALL_SLACK_RATIO = 0.5
_WALL_SLACK_MS = 1.0


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class JobFailed(Exception):
    """Ends a job early with a result already filled in."""


def _timing(times: list[float]) -> Timing:
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return Timing(median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times), calls=len(times),
                  p25_ms=quartiles[0], p75_ms=quartiles[2])


def _seeds(count: int) -> list[int]:
    return [secrets.randbits(31) for _ in range(count)]


def _streamed(seeds: list[int]) -> dict:
    """A timing run's seeds as ``Child.call`` arguments: the first in the command, each next one
    once the call before has ended, so no timed call's inputs can be known ahead of it."""
    return {"seeds": seeds[:1], "calls": len(seeds), "feed": [{"seed": seed} for seed in seeds[1:]]}


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
    evaluation = _Evaluation(job, result, device, baselines or BaselineCache(), lease)
    try:
        try:
            evaluation.run()
        except JobFailed:
            pass
        if answer is not None:
            answer(_concluded(result, job, started))
    finally:
        evaluation.finish(record=answer is None)
    return result if answer is not None else _concluded(result, job, started)


def _concluded(result: EvalResult, job: EvalJob, started: float) -> EvalResult:
    """The result's verdict, whose fault a failure is, and its milestone: the one place a reward
    is decided (reward.py). An evaluator's fault gets no milestone: it says nothing of the candidate."""
    if result.error or result.violations:
        result.correct = False
    if result.correct:
        result.fault = None
    elif result.fault is None:  # wrong outputs or a broken rule
        result.fault = "candidate"
    result.reward = None if result.fault == "evaluator" else milestone_reward(
        result.correct, result.runtime_ms, result.eager_ms, result.compile_ms, job.settings.speedup_margin)
    result.close_calls = close_calls(result) if result.correct else []
    result.duration_s = round(time.monotonic() - started, 3)
    return result


def measure_baselines(task_id: str, task_code: str, *, device: str = "cpu", baselines: BaselineCache | None = None,
                      settings: EvalSettings | None = None) -> EvalResult:
    """Fill the baseline cache for one task (eager and torch.compile, the candidates' protocol).

    Returns an EvalResult carrying only ``eager``/``compiled_baseline`` (or ``error``)."""
    job = EvalJob(job_id="baseline", task_id=task_id, task_code=task_code, language="cpp", device=device.split(":")[0],
                  mode=Mode.PROFILE, snapshot_dir=Path("/nonexistent"), settings=settings or EvalSettings())
    result = EvalResult(job_id=job.job_id, task_id=task_id, language="-", device=job.device, mode=Mode.PROFILE)
    evaluation = _Evaluation(job, result, device if ":" in device or device == "cpu" else f"{device}:0",
                             baselines or BaselineCache())
    try:
        child = evaluation.child("reference")
        setup = evaluation._ask(child, "setup", "running the reference task", device=evaluation.child_device,
                                out_dir=child.path("/job/ref"), task_code=task_code)
        result.device_name = setup["device_name"]
        evaluation._ask(child, "ref_init", "building the reference Model", init_seed=secrets.randbits(31))
        result.eager, result.compiled_baseline = evaluation.baseline_times(child, setup)
    except ChildError as exc:
        result.error, result.fault = f"the reference task failed: {exc}", "evaluator"
    except JobFailed:
        pass
    finally:
        evaluation.finish()
    return result


#: Children started ahead of their jobs, for this process's jobs (see children.Spares).
_SPARES = Spares()


def reserve_spares(per_role: int) -> None:
    """Keep at least ``per_role`` spare children ready per role and device (as many as jobs run at once on one)."""
    _SPARES.depth = max(_SPARES.depth, per_role)


class _Evaluation:
    def __init__(self, job: EvalJob, result: EvalResult, device: str, baselines: BaselineCache,
                 lease: DeviceLease | None = None):
        self.job, self.result, self.device, self.baselines, self.lease = job, result, device, baselines, lease
        self.s = job.settings
        self.children: list[Child] = []
        self.language = get_language(job.language)
        self.timed = job.mode in (Mode.PROFILE, Mode.FINAL)
        self.gpu = device.startswith("cuda")
        self.env = {"CUDA_VISIBLE_DEVICES": device.split(":")[1] if self.gpu else ""}
        self.interpreted = not self.gpu and self.language.name == "triton"
        if self.interpreted:
            self.env["TRITON_INTERPRET"] = "1"
        self.child_device = "cuda:0" if self.gpu else "cpu"
        self.warm = warm_children(self.gpu)
        #: Whether anything of the candidate's has reached a process of this job (see ``fail``).
        self.candidate_exposed = False

    @contextlib.contextmanager
    def step(self, name: str, *, share: str | None = "untimed", record: bool = True, drain: bool = False):
        """Run the block as one step of the job: under the device's lease (``share``: "untimed",
        "timing", or None for a step that leaves the device alone; ``drain``: see
        ``DeviceLease.timing``), its wall time added to ``result.steps_s[name]`` and the wait for
        the lease to ``steps_s["waiting for the device"]`` (unless ``record`` is False: the result
        may have been handed over already)."""
        steps = self.result.steps_s if record else {}
        asked = time.monotonic()
        with contextlib.ExitStack() as held:
            if self.lease is not None and share is not None:
                held.enter_context(self.lease.timing(own=self.children, drain=drain) if share == "timing"
                                   else self.lease.untimed())
            if share == "timing":  # the spares' imports off the processor while it times (shared device or not)
                held.enter_context(_SPARES.paused())
            started = time.monotonic()
            if started - asked > 1e-3:
                steps["waiting for the device"] = round(steps.get("waiting for the device", 0.0) + started - asked, 4)
            try:
                yield
            finally:
                steps[name] = round(steps.get(name, 0.0) + time.monotonic() - started, 4)

    def child(self, role: str) -> Child:
        """This job's ``role`` child: a spare when warm children are on, else one started now."""
        label = f"job-{self.job.job_id}"
        with self.step(f"{role}: start", share=None):
            try:
                if self.warm:
                    child = _SPARES.take(role, env=self.env, gpu=self.gpu, label=label)
                else:
                    child = Child.spawn(role, env=self.env, gpu=self.gpu, label=label)
            except (ChildError, OSError) as exc:
                self.fail(f"the {role} process could not be started (this machine's fault, not your code's): {exc}")
        self.children.append(child)
        if self.lease is not None:
            self.lease.register(child)
        return child

    def finish(self, record: bool = True) -> None:
        """End the job's children and remove their folders (their successors are already starting).
        An untimed step like any other: no timing run on the device meets a process's teardown."""
        with self.step("end children", record=record):
            for child in self.children:
                child.discard()
                if self.lease is not None:
                    self.lease.unregister(child)

    def fail(self, message: str, *, compiled: bool = True, log: str = "", fault: Fault | None = None) -> None:
        """End the job with ``message``. Whose fault it is, unless named: the evaluator's while no
        candidate code can have had a hand in it (before the candidate's files reach its
        process), the candidate's from then on. Conservative on purpose: an evaluator fault is
        never paid as a reward, so nothing the candidate could cause may be classed as one."""
        self.result.error = message
        self.result.compiled = compiled
        self.result.log_tail = log
        self.result.fault = fault or ("candidate" if self.candidate_exposed else "evaluator")
        raise JobFailed

    def run(self) -> None:
        if not (self.job.snapshot_dir / "model_new.py").is_file():
            self.fail("the workspace has no model_new.py", compiled=False, fault="candidate")
        foreign = _foreign_build(self.job.snapshot_dir)
        if foreign:
            self.fail(foreign, compiled=False, fault="candidate")
        broken = check_sources(self.job.snapshot_dir)
        if broken:
            self.result.violations += broken
            self.fail("the sources break the skill's rules (see the violations); nothing was run", fault="candidate")
        trial_seeds = _seeds(self.s.trials)
        timed_seeds = _seeds(self.s.timed_calls)
        checked = sorted(secrets.SystemRandom().sample(range(len(timed_seeds)), min(self.s.checked_timed_calls, len(timed_seeds))))
        fp_seed = secrets.randbits(31)
        init_seed = secrets.randbits(31)
        reference = self.run_reference(trial_seeds, [timed_seeds[i] for i in checked], fp_seed, init_seed)
        self.run_candidate(trial_seeds, timed_seeds, checked, fp_seed, init_seed, reference)

    # ------------------------------------------------------------------ reference

    def run_reference(self, trial_seeds, checked_seeds, fp_seed, init_seed) -> dict:
        """The reference's steps. Its process lives on, holding the trials' outputs, until it has
        compared the candidate's with them (``check_trials``)."""
        child = self.reference = self.child("reference")
        self.ref_dir = child.host_paths["/job/ref"]
        try:
            return self._reference_steps(child, trial_seeds, checked_seeds, fp_seed, init_seed)
        except ChildError as exc:
            self.fail(f"the reference task failed, not your code: {exc}", log=child.log_tail())

    def _reference_steps(self, child: Child, trial_seeds, checked_seeds, fp_seed, init_seed) -> dict:
        setup = self._ask(child, "setup", "running the reference task", device=self.child_device,
                          out_dir=child.path("/job/ref"), task_code=self.job.task_code)
        self.result.device_name = setup["device_name"]
        self._ask(child, "ref_init", "building the reference Model", init_seed=init_seed)
        answer = self._ask(child, "ref_trials", "running the reference Model", seeds=trial_seeds, vary=self.s.vary_inputs,
                           atol=self.s.atol, rtol=self.s.rtol)
        if answer.get("error"):
            self.fail(f"the task cannot be evaluated: {answer['error']}; not your code's fault", fault="evaluator")
        if answer["trivial"] and self.s.refuse_trivial_tasks:
            self.fail(f"the task cannot be evaluated: {'; '.join(answer['trivial'])} (screened at the evaluator's tolerance: "
                      "a constant or copied answer would be paid as correct); not your code's fault. `kernel-env tasks "
                      "--check` lists such tasks", fault="evaluator")
        prints: list = []
        if self.timed:
            self.result.eager, self.result.compiled_baseline = self.baseline_times(child, setup)
            fingerprints = self._ask(child, "ref_fingerprints", "running the reference Model", seeds=checked_seeds, fp_seed=fp_seed)
            prints = list(zip(fingerprints["fingerprints"], fingerprints["precise"]))
        self._ask(child, "ref_release", "freeing the reference Model")
        return {"trials": answer["trials"], "fingerprints": prints, "output_bytes": answer["output_bytes"]}

    def baseline_times(self, child: Child, setup: dict) -> tuple[Timing, Timing | None]:
        key = self.baselines.key(self.job.task_code, setup["device_name"], setup["torch"], self.s.timing_protocol())
        cached = self.baselines.get(key)
        # An entry measured without the compile baseline does not serve a job that wants one.
        if cached and (cached[1] is not None or not self.s.compile_baseline):
            return cached
        timings = []
        for target in ("eager", "compile") if self.s.compile_baseline else ("eager",):
            answer, _ = self.timing_step(child, "reference: ref_time", lambda target=target: child.call(
                "ref_time", self.s.job_timeout_s, yields=False, target=target, **_streamed(_seeds(self.s.timed_calls)),
                warmup_seeds=_seeds(self.s.warmup_calls), flush_bytes=self._flush_bytes(),
                launch_cover_us=self.s.launch_cover_us, fp_seed=0))
            if not answer.get("ok"):
                self.fail(f"timing the reference ({target}) failed: {answer.get('error')}", log=child.log_tail())
            timings.append(_timing(answer["times_ms"]))
        eager, compiled = timings[0], (timings[1] if len(timings) > 1 else None)
        self.baselines.put(key, eager, compiled)
        return eager, compiled

    def _flush_bytes(self) -> int:
        return self.s.flush_bytes if self.gpu else min(self.s.flush_bytes, 32 << 20)

    # ------------------------------------------------------------------ candidate

    def run_candidate(self, trial_seeds, timed_seeds, checked, fp_seed, init_seed, reference) -> None:
        s, result = self.s, self.result
        child = self.child("candidate")
        self.cand_dir = child.host_paths["/job/cand"]
        self.candidate_exposed = True
        with self.step("candidate: copy files", share=None):
            for name in ("init_inputs.pt", "state_dict.pt"):
                shutil.copy2(self.ref_dir / name, self.cand_dir / name)
            # The snapshot is the broker's copy (regular files only); the child sees this copy read-only.
            shutil.copytree(self.job.snapshot_dir, child.host_paths["/job/snapshot"], symlinks=True, dirs_exist_ok=True)
        # It holds the reference's weights and init inputs (copied above) and the trials' outputs, all
        # at once: room for a few times that, so that a candidate filling the host's disk is ended,
        # as its own fault.
        child.quota = (_JOB_FOLDER_FLOOR + _JOB_FOLDER_MULTIPLE * (_folder_bytes(self.cand_dir) + reference["output_bytes"]),
                       _JOB_FOLDER_FILES)
        try:
            self._ask(child, "setup", "starting the candidate process", device=self.child_device,
                      out_dir=child.path("/job/cand"), task_code=self.job.task_code, pid_namespace=child.isolated)
            cand_dir = child.path("/job/cand")
            loaded = self._ask(child, "cand_load", "loading ModelNew", timeout=self.bound("reference: setup", "reference: ref_init"),
                               snapshot=child.path("/job/snapshot"), language=self.language.name,
                               init_inputs=f"{cand_dir}/init_inputs.pt", state_dict=f"{cand_dir}/state_dict.pt", init_seed=init_seed,
                               launch_cover_us=s.launch_cover_us)
            if loaded.get("error"):
                self.fail(loaded["error"], log=child.log_tail())
            if loaded.get("record_problem"):  # this worker's torch, not the candidate: it ran no candidate code yet
                _warn_once(f"{loaded['record_problem']}; work left running on side streams is charged only through the "
                           "host's clock on this worker (docs/design.md, Known limits)")
            if loaded["shape_mismatch"]:
                result.violations.append(f"weights with the reference's names but other shapes: {', '.join(loaded['shape_mismatch'][:5])}")
            trials = self._ask(child, "cand_trials", "running ModelNew", timeout=self.bound("reference: ref_trials"), seeds=trial_seeds,
                               variants=[trial["variant"] for trial in reference["trials"]])
            if trials.get("error"):
                self.fail(trials["error"], log=child.log_tail())
            self.check_trials(reference["trials"], trials["trials"])
            if self.timed:  # gone before the timing run; otherwise finish() ends it with the candidate's
                with self.step("reference: close"):
                    self.reference.close()
            if self.timed and result.correct and not result.violations:
                self.time_candidate(child, timed_seeds, checked, fp_seed, reference["fingerprints"])
            integrity = self._ask(child, "cand_integrity", "checking the candidate process")
            result.violations += [f"ModelNew changed the harness: {c}" for c in integrity["changes"]]
            if integrity["new_threads"]:
                result.violations.append(f"ModelNew left threads running ({', '.join(integrity['new_threads'][:3])}); work must finish inside forward")
            if integrity.get("processes"):
                result.violations.append(_PROCESSES_MESSAGE.format(when="left behind", pids=", ".join(integrity["processes"][:5])))
        except ChildError as exc:
            self.fail(str(exc), log=child.log_tail(), fault=_lost_with_its_server(child))

    def check_trials(self, ref_trials: list[dict], cand_trials: list[dict]) -> None:
        s, result = self.s, self.result
        for index, (ref, cand) in enumerate(zip(ref_trials, cand_trials)):
            if ref["non_tensor_outputs"]:
                self.fail(f"the task cannot be evaluated: its Model returns {', '.join(ref['non_tensor_outputs'])}, not tensors "
                          "(an output must be a tensor, or a tuple or list of them); not your code's fault", fault="evaluator")
            if cand["non_tensor_outputs"]:
                result.trials.append(TrialReport(trial=index, correct=False, message=f"returned {', '.join(cand['non_tensor_outputs'])} instead of plain tensors"))
                break
            report = self.compare_trial(index)
            result.trials.append(report)
            if cand["mutated_inputs"] and not ref["mutated_inputs"]:
                result.violations.append("ModelNew.forward modified its input tensors in place (the reference does not)")
            self.check_rules([cand], expected=1, when="")
            if not report.correct or result.violations:
                break
        result.violations = list(dict.fromkeys(result.violations))
        result.correct = bool(result.trials) and all(t.correct for t in result.trials) and len(result.trials) == s.trials

    def compare_trial(self, index: int) -> TrialReport:
        """The reference's process compares trial ``index``: the candidate's output file moves
        into its directory (a rename; the reference's process trusts nothing about the file)."""
        name = f"cand_trial_{index}.out"
        try:
            os.replace(self.cand_dir / name, self.ref_dir / name)
        except FileNotFoundError:
            pass  # the reference's process says so
        try:
            answer = self._ask(self.reference, "ref_compare", f"comparing trial {index + 1}'s outputs", trial=index,
                               file=f"{self.reference.path('/job/ref')}/{name}", atol=self.s.atol, rtol=self.s.rtol)
        except ChildError as exc:
            self.fail(f"comparing trial {index + 1}'s outputs failed: {exc}")
        if "unreadable" in answer:
            self.fail(f"the output of trial {index + 1} could not be read back ({answer['unreadable']}); "
                      "the candidate process must not touch the harness's files")
        return TrialReport(**answer["report"])

    def check_rules(self, audits: list[dict], *, expected: int, when: str) -> None:
        """Rule violations seen by audited calls (the trials, and secret positions of the timing run)."""
        result = self.result
        suffix = f" ({when})" if when else ""
        if len(audits) != expected:
            result.violations.append(f"the audited calls were not all reported{suffix}: the audit was interfered with")
            return
        for found in audits:
            if found.get("torch_ops"):
                ops = ", ".join(f"{name} x{count}" for name, count in sorted(found["torch_ops"].items())[:8])
                result.violations.append(f"torch computes inside ModelNew.forward{suffix} ({ops}); all compute must be in your own kernels")
            if found.get("processes"):
                result.violations.append(_PROCESSES_MESSAGE.format(when=f"running{suffix or ' (trials)'}", pids=", ".join(found["processes"][:5])))
            if self.language.name == "triton" and found.get("triton_launches", 0) == 0 and not found.get("empty_output"):
                result.violations.append(f"ModelNew.forward launched no Triton kernel{suffix}; compute must happen in Triton kernels")
            if (found.get("anchor_kernels") or 0) > 2:
                result.violations.append(f"ModelNew ran a kernel named like one of the evaluator's{suffix} "
                                         f"({COVER_KERNEL} or {END_KERNEL}); rename it")
            early, late = found.get("early_work_us"), found.get("late_work_us")
            outside = []
            if early is not None and early > EARLY_WORK_TOLERANCE_US:
                outside.append(f"{early:.1f} us before its call began")
            if late is not None and late > LATE_WORK_TOLERANCE_US:
                outside.append(f"{late:.1f} us after it returned")
            if outside and not any("on a stream not ordered" in v for v in result.violations):  # once, for the first call seen
                result.violations.append(
                    f"ModelNew.forward ran work on the device {' and '.join(outside)}{suffix}, on a stream not ordered "
                    "with the current one: a side stream must wait for the current stream before its work "
                    "(side.wait_stream(torch.cuda.current_stream())) and be joined back before forward returns "
                    "(torch.cuda.current_stream().wait_stream(side); C++: cudaEventRecord + cudaStreamWaitEvent)")
        result.violations = list(dict.fromkeys(result.violations))

    def time_candidate(self, child: Child, timed_seeds, checked, fp_seed, ref_prints) -> None:
        s, result = self.s, self.result
        per_trial = self.result.steps_s.get("reference: ref_trials", 0.0) / max(1, s.trials)
        warm = self._ask(child, "cand_warmup", "warming up ModelNew", seeds=_seeds(s.warmup_calls),
                         timeout=self.bound(per_trial * s.warmup_calls, cap=s.job_timeout_s))
        if warm.get("error"):
            self.fail(warm["error"], log=child.log_tail())
        audit_at = sorted(secrets.SystemRandom().sample(range(len(timed_seeds)), min(s.audited_timed_calls, len(timed_seeds))))
        per_call = self.result.steps_s.get("candidate: cand_warmup", 0.0) / max(1, s.warmup_calls)
        calls = len(timed_seeds) + len(audit_at)
        waited_before = _run_delay_ms(child.proc.pid)
        answer, marks = self.timing_step(child, "candidate: cand_time", lambda: child.call(
            "cand_time", self.bound(per_call * calls, cap=s.job_timeout_s, floor=s.timing_floor_s), yields=False,
            **_streamed(timed_seeds), warmup_seeds=[], flush_bytes=self._flush_bytes(), launch_cover_us=s.launch_cover_us,
            fp_seed=fp_seed, audit_at=audit_at))
        if not answer.get("ok") or answer.get("error"):
            self.fail(answer.get("error") or "timing failed", log=child.log_tail())
        times, prints = answer["times_ms"], answer["fingerprints"]
        if any(not part.get("plain", False) for call in prints for part in call):
            result.violations.append("a timed call returned something other than plain tensors (a lazy tensor subclass?)")
            result.correct = False
            return
        self.check_rules(answer.get("audits", []), expected=len(audit_at), when="during timing")
        if answer.get("processes"):
            result.violations.append(_PROCESSES_MESSAGE.format(when="running during timing", pids=", ".join(answer["processes"][:5])))
        if answer.get("threads"):
            result.violations.append(f"ModelNew had threads running during timing ({', '.join(answer['threads'][:3])}); "
                                     "work must finish inside forward")
        if result.violations:
            result.correct = False
            return
        if len(times) != len(timed_seeds) or len(prints) != len(timed_seeds):
            result.violations.append("the timing run returned the wrong number of measurements")
            return
        for position, index in enumerate(checked):
            if not any(expected is not None and fingerprints_match(expected, prints[index], s.atol, s.rtol)
                       for expected in ref_prints[position]):
                result.violations.append(f"timed call {index} returned a wrong result (the output of a timed call must be correct too)")
                result.correct = False
                return
        result.runtime = _timing(times)
        waited_after = _run_delay_ms(child.proc.pid)
        waited = (waited_after - waited_before) if waited_before is not None and waited_after is not None else 0.0
        problem = _clock_mismatch(times, marks, waited_ms=waited)
        if problem:
            result.violations.append(problem)
            result.correct = False

    def timing_step(self, child: Child, name: str, run: Callable[[], tuple]) -> tuple:
        """``run()``, a timing run, as the step ``name`` under the device's lease. On a shared GPU
        the device is probed first (``timing.other_work_ms``): a kernel that another job's step
        launched before the lease froze it may still run there (sharing.py). Then the run waits
        until every untimed step has ended (``drain``) and is made without the probe."""
        probe = self.lease is not None and self.gpu
        for drain in (False, True):
            with self.step(name, share="timing", drain=drain):
                if probe and not drain:
                    # Bounded like the shortest timing run: it holds the device, in the candidate's process.
                    busy = child.call("device_probe", self.s.timing_floor_s, yields=False)[0].get("busy_ms")
                    if busy:
                        self.result.steps_s["device busy with another job's kernel"] = busy
                        continue
                return run()
        raise AssertionError("unreachable: the drained attempt always runs")

    def bound(self, *work: str | float, cap: float | None = None, floor: float | None = None) -> float:
        """The deadline of a candidate's step: a floor plus ``step_multiple`` times what the same
        work took (``work``: seconds, or the names of the reference's steps that did it), at most
        ``cap`` (``step_timeout_s``). A bad sample costs its slot this long, not the cap. Triton's
        interpreter (on the CPU) gets the cap: its pace bears no relation to the reference's."""
        s = self.s
        cap = s.step_timeout_s if cap is None else cap
        if self.interpreted:
            return cap
        seconds = sum(self.result.steps_s.get(w, 0.0) if isinstance(w, str) else w for w in work)
        return min(cap, (s.step_floor_s if floor is None else floor) + s.step_multiple * seconds)

    def _ask(self, child: Child, cmd: str, doing: str, timeout: float | None = None, share: str = "untimed",
             **payload) -> dict:
        with self.step(f"{child.role}: {cmd}", share=share):
            answer, _ = child.call(cmd, timeout or self.s.step_timeout_s, yields=share != "timing", **payload)
        if not answer.get("ok"):
            self.fail(f"{doing} failed: {answer.get('error')}", log=child.log_tail())
        return answer


#: A candidate's job folder holds at most this floor + this multiple of what it must hold (the
#: reference's weights and init inputs, the trials' outputs), in this many files.
_JOB_FOLDER_FLOOR = 1 << 30
_JOB_FOLDER_MULTIPLE = 4
_JOB_FOLDER_FILES = 10_000


def _folder_bytes(folder: Path) -> int:
    return sum(path.lstat().st_blocks * 512 for path in folder.rglob("*"))


#: How long a child's death may precede its fork server's seen end (see ``_lost_with_its_server``).
_SERVER_END_GRACE_S = 1.0


def _lost_with_its_server(child: Child) -> Fault | None:
    """"evaluator" when a child died because its fork server did (killed, out of host memory):
    the end of the server's pid namespace takes every child with it, and nothing in a child's
    namespaces can reach the server. None leaves the verdict to ``fail``'s rule. Only a child that
    was killed outright (SIGKILL, as the end of a namespace kills) is looked into: a crash or an
    exit of its own costs the job no wait."""
    if child.proc.poll() != -signal.SIGKILL:
        return None
    return "evaluator" if child.zygote.ended_within(_SERVER_END_GRACE_S) else None


def _foreign_build(snapshot: Path) -> str | None:
    """Why the snapshot's built module cannot load here (built against another torch), or None.

    Reads what the build wrote (build/build_info.json); it comes from the sandbox, so it only
    turns an obscure import failure into a clear message and decides nothing else."""
    if not list((snapshot / "build").glob("cuda_extension*.so")):
        return None
    try:
        with _open_untrusted(snapshot / "build" / "build_info.json", 1 << 20) as handle:
            built_with = json.loads(handle.read()).get("torch")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(built_with, str) and built_with != torch.__version__:
        return (f"build/ holds a module built against torch {built_with[:40]}, but this GPU worker runs torch "
                f"{torch.__version__}: an extension only loads into the torch it was built with. Build with the "
                f"worker's torch (its sandbox image) and evaluate again")
    return None


@contextlib.contextmanager
def _open_untrusted(path: Path, limit: int):
    """Open a file the sandboxed side wrote, trusting nothing about it: a regular file (no link,
    fifo or device) of at most ``limit`` bytes, else ValueError (or OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes is more than this file may take")
        yield handle


def _run_delay_ms(pid: int) -> float | None:
    """How long the process's main thread (the one that makes the timed calls) has waited, runnable,
    for a processor so far: the kernel's own count (/proc/PID/schedstat, as the host sees it,
    beyond the candidate's reach). None where the kernel keeps no such count."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def _clock_mismatch(times: list[float], marks: list[tuple[str, int, float]], waited_ms: float = 0.0) -> str | None:
    """Compare what the candidate's process measured with what the kernel's clock saw.

    The child announces each timed call just before its start mark and just after its end
    mark, on a socket whose messages the kernel stamps as they are sent: the stamps bracket the
    call from outside the candidate's reach, whenever this process gets round to reading them.
    A call cannot take less wall time than its marks claim, so claimed times far below the
    bracketed ones mean a patched timer or work hidden from the marks.

    ``waited_ms``: how long the calling thread waited, runnable, for a processor over the whole
    run (``_run_delay_ms``). On a busy host a child can lose its processor between an
    announcement and its mark, in most calls of a run: on a loaded 2-core machine an honest
    0.1 ms kernel showed 4.6 ms gaps in 4 of 5 calls. A gap the waits can account for in full
    proves nothing, so only the part of the gaps beyond the waits counts.
    """
    starts = {k: t for kind, k, t in marks if kind == "start"}
    ends = {k: t for kind, k, t in marks if kind == "end"}
    expected = list(range(len(times)))
    if sorted(starts) != expected or sorted(ends) != expected or len(marks) != 2 * len(times):
        return "the timing run did not report every timed call exactly once (the timing protocol was interfered with)"
    # Per call, the wall time beyond what the call claims. A patched timer under-reports every
    # call; the child being preempted on a busy host inflates some. So judge the calls with the
    # least excess (the lower quartile), and only a gap that all but a few calls show counts.
    excess = sorted((ends[k] - starts[k]) * 1e3 - times[k] for k in expected)
    claimed = sorted(times)
    low_excess, median_claimed = excess[len(excess) // 4], claimed[len(claimed) // 2]
    slack = _WALL_SLACK_RATIO * median_claimed + _WALL_SLACK_MS
    if low_excess > slack and sum(max(0.0, e - slack) for e in excess) > waited_ms:
        return (f"timing does not add up: a timed call claims {median_claimed:.3f} ms (median) but an independent "
                f"clock saw at least {median_claimed + low_excess:.3f} ms for most calls (patched timer or hidden work?)")
    return None
