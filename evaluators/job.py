"""The mechanics of one evaluation job: its children, the device's lease, the bounds of a
candidate's steps, and whose fault a failure is. What the job does with them is the harness's
script (``harness.py``); this module decides nothing about a candidate.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import time
from collections.abc import Callable

from kernel_env.config import warm_children
from kernel_env.evaluators.child.protocol import (
    DeviceProbe,
    Drive,
    DriveAnswer,
    Message,
    ProbeAnswer,
    Serve,
    ServeAnswer,
)
from kernel_env.evaluators.children import Child, ChildError, CommandFailed, Spares
from kernel_env.evaluators.records import EvalJob, EvalResult, Fault
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.languages import get_language

#: Each step of a job as it begins (INFO, the job's id in ``record.job_id``): what a long evaluation is
#: doing now, for a progress line (``kernel-env run-task``) or a log.
steps_log = logging.getLogger("kernel_env.evaluators.steps")

#: Children started ahead of their jobs, for this process's jobs (see children.Spares).
SPARES = Spares()
#: How long a child's death may precede its fork server's seen end (see ``lost_with_its_server``).
_SERVER_END_GRACE_S = 1.0
#: The worker answers its ``Serve`` once the judge has told it to stop: this long at most after the judge's answer.
_WORKER_AFTER_JUDGE_S = 30.0


class JobFailed(Exception):
    """Ends a job early with a result already filled in."""


class Job:
    """One job's children and steps. ``fail`` ends it; ``finish`` ends its children."""

    def __init__(self, job: EvalJob, result: EvalResult, device: str, lease: DeviceLease | None = None):
        self.job, self.result, self.device, self.lease = job, result, device, lease
        self.s = job.settings
        self.children: list[Child] = []
        self.language = get_language(job.language)
        self.timed = job.mode.value in ("profile", "final")
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
        steps_log.info("%s", name, extra={"job_id": self.job.job_id})
        asked = time.monotonic()
        with contextlib.ExitStack() as held:
            if self.lease is not None and share is not None:
                held.enter_context(self.lease.timing(own=self.children, drain=drain) if share == "timing"
                                   else self.lease.untimed())
            if share == "timing":  # the spares' start off the processor while it times (shared device or not)
                held.enter_context(SPARES.paused())
            started = time.monotonic()
            if started - asked > 1e-3:
                steps["waiting for the device"] = round(steps.get("waiting for the device", 0.0) + started - asked, 4)
            try:
                yield
            finally:
                steps[name] = round(steps.get(name, 0.0) + time.monotonic() - started, 4)

    def child(self, role: str) -> Child:
        """A new ``role`` child of this job: a spare when warm children are on, else one started now."""
        # The label names the child's folders: a job id is any string (a task id's slashes included).
        label = "job-" + re.sub(r"[^\w.-]", "_", self.job.job_id)[:80]
        with self.step(f"{role}: start", share=None):
            try:
                if self.warm:
                    child = SPARES.take(role, env=self.env, gpu=self.gpu, label=label)
                else:
                    child = Child.spawn(role, env=self.env, gpu=self.gpu, label=label)
            except (ChildError, OSError) as exc:
                self.fail(f"the {role} process could not be started (this machine's fault, not your code's): {exc}")
        self.children.append(child)
        if self.lease is not None:
            self.lease.register(child)
        return child

    def discard(self, child: Child) -> None:
        """End one child before the job ends (the baselines' worker), as an untimed step."""
        with self.step("end children"):
            child.discard()
            if self.lease is not None:
                self.lease.unregister(child)
        self.children.remove(child)

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

    def ask(self, child: Child, command: Message, answer: type[Message] | None, doing: str, *,
            timeout: float | None = None, share: str = "untimed"):
        """``command``'s answer from ``child``, as one step (``step``); a failure ends the job (``fail``)."""
        with self.step(f"{child.role}: {type(command).__name__}", share=share):
            try:
                return child.call(command, answer, timeout or self.s.step_timeout_s, yields=share != "timing")
            except CommandFailed as exc:
                self.fail(f"{doing} failed: {exc}", log=child.log_tail())
            except ChildError as exc:
                self.fail(f"{doing} failed: {exc}", log=child.log_tail(), fault=lost_with_its_server(child))

    def converse(self, judge: Child, worker: Child, drive: Drive, timeout: float, *, yields: bool = True
                 ) -> tuple[DriveAnswer, ServeAnswer]:
        """One phase of calls (``drive``) between the job's judge and a worker (run it inside a step):
        the worker serves, the judge drives and answers. ChildError (or CommandFailed) where either
        child dies, hangs past ``timeout`` or fails; the caller decides whose fault that is."""
        worker.send(Serve())
        judge.send(drive)
        try:
            driven = judge.receive(drive, DriveAnswer, timeout, yields=yields, beside=[worker])
        except (ChildError, CommandFailed):
            worker.kill()
            raise
        served = worker.receive(Serve(), ServeAnswer, _WORKER_AFTER_JUDGE_S, yields=yields, beside=[judge])
        return driven, served

    def timing_step(self, judge: Child, name: str, run: Callable[[], object]):
        """``run()``, a timing run, as the step ``name`` under the device's lease. On a shared GPU
        the device is probed first (``exchange.other_work_ms``, from the judge's process): a kernel
        that another job's step launched before the lease froze it may still run there
        (sharing.py). Then the run waits until every untimed step has ended (``drain``) and is
        made without the probe."""
        probe = self.lease is not None and self.gpu
        for drain in (False, True):
            with self.step(name, share="timing", drain=drain):
                if probe and not drain:
                    busy = judge.call(DeviceProbe(), ProbeAnswer, self.s.timing_floor_s, yields=False).busy_ms
                    if busy:
                        self.result.steps_s["device busy with another job's kernel"] = busy
                        continue
                return run()
        raise AssertionError("unreachable: the drained attempt always runs")


def lost_with_its_server(child: Child) -> Fault | None:
    """"evaluator" when a child died because its fork server did (killed, out of host memory):
    the end of the server's pid namespace takes every child with it, and nothing in a child's
    namespaces can reach the server. None leaves the verdict to ``fail``'s rule. Only a child that
    was killed outright (SIGKILL, as the end of a namespace kills) is looked into: a crash or an
    exit of its own costs the job no wait."""
    if child.proc.poll() != -signal.SIGKILL:
        return None
    return "evaluator" if child.zygote.ended_within(_SERVER_END_GRACE_S) else None
