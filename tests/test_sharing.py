"""Jobs sharing one device: untimed steps side by side, every timing run alone (evaluators/sharing.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from kernel_env.evaluators.child import protocol
from kernel_env.evaluators.child.protocol import RefInit, Setup
from kernel_env.evaluators.children import Child, Spares
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode
from kernel_env.evaluators.sharing import DeviceLease
from kernel_env.resources import example_dir
from kernel_env.runtime import pool as pool_module


class _Child:
    """A job's child as the lease sees it; ``in_call_until``: a call with its worker in flight until then
    (``time.monotonic()``), during which it must not be frozen."""

    def __init__(self, freezes: bool = True, in_call_until: float = 0.0):
        self.freezes, self.frozen, self.in_call_until = freezes, False, in_call_until
        self.paused = self.frozen_in_call = self.held = False

    def freeze(self, wait: bool = True) -> bool:
        self.frozen = self.freezes
        self.frozen_in_call |= self.freezes and time.monotonic() < self.in_call_until
        return self.freezes

    def wait_frozen(self) -> bool:
        return self.frozen

    def thaw(self) -> None:
        self.frozen = False

    def pause_calls(self) -> bool:
        self.paused = time.monotonic() >= self.in_call_until
        return self.paused

    def resume_calls(self) -> None:
        self.paused = False


class _Recorder:
    """Intervals during which each kind of step held the lease, from many threads."""

    def __init__(self, lease: DeviceLease):
        self.lease, self.spans, self._lock = lease, [], threading.Lock()

    def run(self, kind: str, seconds: float, **options) -> None:
        with (self.lease.timing(**options) if kind == "timing" else self.lease.untimed()):
            began = time.monotonic()
            time.sleep(seconds)
            with self._lock:
                self.spans.append((kind, began, time.monotonic()))


def _overlap(a: tuple, b: tuple) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_untimed_steps_run_together_and_a_timing_run_alone():
    recorder = _Recorder(DeviceLease())
    work = [("untimed", 0.2)] * 6 + [("timing", 0.1)] * 3
    threads = [threading.Thread(target=recorder.run, args=item) for item in work]
    for index, thread in enumerate(threads):
        thread.start()
        time.sleep(0.02 * (index % 3))
    for thread in threads:
        thread.join(10)
    untimed = [s for s in recorder.spans if s[0] == "untimed"]
    timing = [s for s in recorder.spans if s[0] == "timing"]
    assert len(untimed) == 6 and len(timing) == 3
    assert any(_overlap(a, b) for i, a in enumerate(untimed) for b in untimed[i + 1:])  # they did share the device
    for run in timing:
        assert not any(_overlap(run, other) for other in recorder.spans if other is not run), recorder.spans


def _untimed_then_timing(lease: DeviceLease, order: list) -> list[threading.Thread]:
    """An untimed step of 0.3 s, and 0.05 s into it a timing run of 0.05 s asking for the lease."""
    first = threading.Thread(target=lambda: _hold(lease.untimed(), 0.3, order, "first untimed"))
    first.start()
    time.sleep(0.05)
    timing = threading.Thread(target=lambda: _hold(lease.timing(), 0.05, order, "timing"))
    timing.start()
    return [first, timing]


def test_a_waiting_timing_run_goes_before_untimed_steps_asked_for_later():
    lease, order = DeviceLease(), []
    threads = _untimed_then_timing(lease, order)
    time.sleep(0.05)
    later = threading.Thread(target=lambda: _hold(lease.untimed(), 0.01, order, "later untimed"))
    later.start()
    for thread in (*threads, later):
        thread.join(5)
    assert order == ["first untimed", "timing", "later untimed"]


def test_the_lease_accounts_for_its_time_by_state():
    """0.3 s untimed, of which 0.25 s with a timing run waiting (draining), then 0.05 s timing, then idle."""
    lease = DeviceLease()
    for thread in _untimed_then_timing(lease, []):
        thread.join(5)
    time.sleep(0.1)
    spent = lease.account()
    assert set(spent) == set(DeviceLease.STATES)
    assert 0.04 <= spent["untimed"] <= 0.1
    assert 0.2 <= spent["draining"] <= 0.3
    assert 0.045 <= spent["timing"] <= 0.1
    assert spent["idle"] >= 0.1
    assert lease.account()["idle"] >= spent["idle"]  # it goes on counting


def _hold(context, seconds: float, order: list, name: str) -> None:
    with context:
        time.sleep(seconds)
        order.append(name)


def test_a_timing_run_freezes_the_other_jobs_children_and_thaws_them_after():
    lease = DeviceLease()
    mine, theirs, unfreezable = _Child(), _Child(), _Child(freezes=False)
    for child in (mine, theirs, unfreezable):
        lease.register(child)
    with lease.timing(own=[mine]):
        assert theirs.frozen and not mine.frozen and not unfreezable.frozen
    assert not theirs.frozen
    lease.unregister(theirs)
    with lease.timing(own=[mine]):
        assert not theirs.frozen


def test_a_timing_run_freezes_no_child_inside_a_call_with_its_worker():
    """A child whose call is in flight is frozen once the call has ended (and none starts meanwhile:
    its calls are paused until the run is over); one whose call outlasts ``call_wait_s`` (a hang) is
    frozen in it all the same, and counted."""
    lease = DeviceLease(grace_s=0.0, call_wait_s=1.0)
    calling = _Child(in_call_until=time.monotonic() + 0.2)
    lease.register(calling)
    asked = time.monotonic()
    with lease.timing():
        waited = time.monotonic() - asked
        assert calling.frozen and calling.paused and not calling.frozen_in_call
    assert not calling.frozen and not calling.paused
    assert 0.15 <= waited < 0.9 and lease.frozen_in_call == 0, waited

    hung = _Child(in_call_until=time.monotonic() + 60)
    lease.register(hung)
    asked = time.monotonic()
    with lease.timing():
        waited = time.monotonic() - asked
        assert hung.frozen and hung.frozen_in_call and not hung.paused
    assert 0.9 <= waited < 2.0 and lease.frozen_in_call == 1, waited


def test_a_judge_s_back_to_back_calls_are_paused_within_one_call():
    """The judge's side of the pause, as judge.py takes it around each call on a GPU: it passes the gate
    (``protocol.CALLS_GATE``), holds the calls lock through the call, and starts the next one at once. A
    timing run's pause waits for the call in flight and no longer, and no call starts until
    ``resume_calls``. (Without the gate its tries fell between two calls of a step, a moment each, and
    it waited out the step: 31-36 s of a 128-episode run on an H100.)"""
    import fcntl

    child = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    stop, calls = threading.Event(), [0]
    gate, lock = (os.open(child.host_paths["/job/ref"] / name, os.O_RDONLY)
                  for name in (protocol.CALLS_GATE, protocol.CALLS_LOCK))

    def judge() -> None:
        while not stop.is_set():
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_EX)
            fcntl.flock(gate, fcntl.LOCK_UN)
            time.sleep(0.005)  # the call
            calls[0] += 1
            fcntl.flock(lock, fcntl.LOCK_UN)

    calling = threading.Thread(target=judge, daemon=True)
    try:
        calling.start()
        time.sleep(0.05)
        asked = time.monotonic()
        while not child.pause_calls() and time.monotonic() < asked + 5:
            time.sleep(0.0005)
        waited, made = time.monotonic() - asked, calls[0]
        assert waited < 0.05, f"the pause waited {waited:.3f} s for calls of 0.005 s"
        time.sleep(0.1)
        assert calls[0] == made, "a call started while the judge was paused"
        child.resume_calls()
        time.sleep(0.1)
        assert calls[0] > made, "the judge did not call again once resumed"
    finally:
        stop.set()
        calling.join(5)
        os.close(gate)
        os.close(lock)
        child.discard()
    worker = Child.spawn("worker", env={}, gpu=False, label="test-freeze")
    try:
        assert worker.pause_calls()  # a worker starts no calls
    finally:
        worker.discard()


def _small_setup(child: Child) -> Setup:
    return Setup(device="cpu", out_dir=child.path("/job/ref"),
                 task_code=(example_dir() / "task.py").read_text().replace("1 << 24", "1 << 10"))


def test_a_frozen_child_answers_only_once_thawed_and_its_deadline_does_not_count_the_time_frozen():
    child = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    try:
        if not child.freeze():  # before its first answer: stopped, not held
            pytest.skip("nothing here can stop a child: no freezable cgroup and no pid namespace (bubblewrap)")
        assert not child.held
        answered, raised = threading.Event(), []

        def ask() -> None:
            try:
                child.call(_small_setup(child), None, 3.0)  # a deadline shorter than the time it is held frozen
                answered.set()
            except Exception as exc:  # noqa: BLE001 - the test says what it was
                raised.append(exc)

        worker = threading.Thread(target=ask)
        worker.start()
        assert not answered.wait(4.0), "a frozen child answered"
        assert not raised, raised
        child.thaw()
        assert answered.wait(60), f"the thawed child did not answer: {raised}"
        assert child.frozen_s() >= 4.0
        worker.join(5)
    finally:
        child.discard()


def test_an_idle_judge_is_held_not_stopped_and_a_command_to_it_waits_for_the_thaw():
    """A judge between commands runs only the harness's code, waiting on its stdin: a timing run holds
    it (``Child.held``: nothing to signal, nothing to wait for) and a command sent meanwhile waits until
    the thaw. A judge inside a command and a worker are stopped, idle or not."""
    judge = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    worker = Child.spawn("worker", env={}, gpu=False, label="test-freeze")
    try:
        if judge._namespace is None and judge._cgroup is None:
            pytest.skip("nothing here can stop a child: no freezable cgroup and no pid namespace (bubblewrap)")
        judge.call(_small_setup(judge), None, 120)  # answered: a later command is what must make it busy again
        spin = "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end:\n    pass\n"
        setup = threading.Thread(target=judge.call, args=(Setup(device="cpu", out_dir=judge.path("/job/ref"),
                                                                 task_code=spin + _small_setup(judge).task_code), None, 120))
        setup.start()
        time.sleep(0.5)
        assert judge.freeze() and not judge.held, "a judge inside a command was not stopped"
        before = _cpu_ticks(judge)
        time.sleep(0.3)
        assert _cpu_ticks(judge) == before
        judge.thaw()
        setup.join(60)
        assert judge.freeze() and judge.held, "an idle judge was stopped, not held"
        assert "T" not in {Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] for pid in _pids(judge)}
        answered = threading.Event()
        asking = threading.Thread(target=lambda: (judge.call(RefInit(init_seed=1), None, 60), answered.set()))
        asking.start()
        assert not answered.wait(0.5), "a held judge was sent a command"
        judge.thaw()
        assert answered.wait(60) and not judge.held
        asking.join(5)
        worker.call(Setup(device="cpu", out_dir=worker.path("/job/cand"), task_code=_small_setup(judge).task_code), None, 120)
        assert worker.freeze() and not worker.held, "an idle worker was held: the candidate's code may run on there"
        worker.thaw()
    finally:
        judge.discard()
        worker.discard()


def test_a_judge_frozen_inside_a_call_that_outlasted_the_wait_gets_its_gate_back():
    """A call that hangs past ``call_wait_s`` is frozen in it all the same; the judge's gate, which the
    timing run took to keep it from starting another call, is let go with the run, or the judge could
    never start a call again."""
    import fcntl

    child = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    gate, lock = (os.open(child.host_paths["/job/ref"] / name, os.O_RDONLY)
                  for name in (protocol.CALLS_GATE, protocol.CALLS_LOCK))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the judge's side: a call in flight, and hung
        lease = DeviceLease(grace_s=0.0, call_wait_s=0.2)
        lease.register(child)
        with lease.timing():
            with pytest.raises(BlockingIOError):  # no new call could start meanwhile
                fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert lease.frozen_in_call == 1
        fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)  # and now one can
    finally:
        os.close(gate)
        os.close(lock)
        child.discard()


def _untimed_step(lease: DeviceLease, seconds: float) -> threading.Thread:
    """An untimed step of ``seconds`` in a thread of its own, returned once it holds the lease."""
    entered = threading.Event()

    def step() -> None:
        with lease.untimed():
            entered.set()
            time.sleep(seconds)

    thread = threading.Thread(target=step)
    thread.start()
    assert entered.wait(5)
    return thread


def test_an_untimed_step_that_outlasts_the_grace_is_frozen_for_the_timing_run():
    """A hung step (here: 3 s) holds a timing run up for the lease's grace only; it is frozen
    meanwhile and thawed after, and a new untimed step waits for the run as before."""
    lease = DeviceLease(grace_s=0.2)
    straggler, mine, order = _Child(), _Child(), []
    lease.register(straggler)
    hung = _untimed_step(lease, 3.0)
    asked = time.monotonic()
    with lease.timing(own=[mine]):
        waited = time.monotonic() - asked
        assert straggler.frozen and not mine.frozen
        later = threading.Thread(target=lambda: _hold(lease.untimed(), 0.0, order, "later untimed"))
        later.start()
        time.sleep(0.1)
        order.append("timing")
    later.join(5)
    assert 0.15 <= waited < 1.0, waited
    assert not straggler.frozen and lease.stragglers == 1
    assert order == ["timing", "later untimed"]
    hung.join(5)


def test_a_step_that_has_run_past_the_grace_already_holds_a_timing_run_up_not_at_all():
    lease = DeviceLease(grace_s=0.2)
    lease.register(_Child())
    hung = _untimed_step(lease, 1.5)
    time.sleep(0.4)
    asked = time.monotonic()
    with lease.timing():
        waited = time.monotonic() - asked
    assert waited < 0.1 and lease.stragglers == 1, waited
    hung.join(5)


def test_a_straggler_that_cannot_be_frozen_is_waited_for():
    lease = DeviceLease(grace_s=0.1)
    lease.register(_Child(freezes=False))
    thread = _untimed_step(lease, 0.6)
    asked = time.monotonic()
    with lease.timing():
        waited = time.monotonic() - asked
    thread.join(5)
    assert waited >= 0.5 and lease.stragglers == 0, waited


@pytest.mark.slow  # 13 s: real evaluations side by side
def test_jobs_sharing_a_lease_are_judged_as_alone(tmp_path):
    """Two verifications and a profile of the bundled Triton solution at once, through real children
    on the CPU: all correct, and the profile's timing runs overlap none of the others' steps."""
    code = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 10")
    snapshot = tmp_path / "snapshot"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text((example_dir() / "solutions" / "triton" / "model_new.py").read_text())
    settings = EvalSettings(timed_calls=5, warmup_calls=1)
    lease, spans, lock = DeviceLease(), [], threading.Lock()
    untimed, timing = lease.untimed, lease.timing

    def recorded(kind, original):
        def wrapper(*args, **kwargs):
            class Span:
                def __enter__(self):
                    self.inner = original(*args, **kwargs)
                    self.inner.__enter__()
                    self.began = time.monotonic()

                def __exit__(self, *exc):
                    with lock:
                        spans.append((kind, self.began, time.monotonic()))
                    return self.inner.__exit__(*exc)
            return Span()
        return wrapper

    lease.untimed, lease.timing = recorded("untimed", untimed), recorded("timing", timing)
    results = {}

    def run(name: str, mode: Mode) -> None:
        job = EvalJob(job_id=uuid.uuid4().hex[:12], task_id="test/relu_add_1k", task_code=code, language="triton",
                      device="cpu", mode=mode, snapshot_dir=snapshot, settings=settings)
        results[name] = evaluate(job, device="cpu", lease=lease)

    threads = [threading.Thread(target=run, args=(name, mode))
               for name, mode in (("verify-1", Mode.VERIFY), ("profile", Mode.PROFILE), ("verify-2", Mode.VERIFY))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    for name, result in results.items():
        assert result.correct and not result.violations, (name, result.error, result.violations)
    assert len(results) == 3
    runs = [s for s in spans if s[0] == "timing"]
    assert runs, spans  # the profile's candidate timing (and its baselines)
    for run in runs:
        assert not any(_overlap(run, other) for other in spans if other is not run)


def test_a_closed_child_counts_as_frozen_and_thaws_harmlessly():
    """Nothing of an ended child runs, so a timing run need not wait for it."""
    child = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    child.close()
    try:
        assert child.freeze() is True
        child.thaw()
        assert child.frozen_s() == 0.0
    finally:
        child.discard()


def _cpu_ticks(child: Child) -> int:
    """CPU time the child's processes have used so far (utime + stime, from /proc as the host sees them)."""
    ticks = 0
    for pid in _pids(child):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks


def test_spares_make_no_progress_while_a_timing_run_lasts():
    """A spare busy when a timing run starts (here: running a task whose import spins for seconds)
    is stopped (cgroup freezer or SIGSTOP) until the run is over, so the run has the processor."""
    spares = Spares(depth=1)
    try:
        spares.prepare("judge", env={}, gpu=False)
        (waiting,) = spares._waiting[Spares._key("judge", {}, False)]
        child = waiting.result(timeout=60)
        if child._namespace is None:
            pytest.skip("no bubblewrap here: a child has no pid namespace to stop")
        busy = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\n"
        answered = threading.Event()
        worker = threading.Thread(target=lambda: (child.call(Setup(device="cpu", out_dir=child.path("/job/ref"), task_code=busy),
                                                             None, 120), answered.set()))
        worker.start()
        time.sleep(0.5)
        assert _cpu_ticks(child) > 0, "the spare was not busy"
        with spares.paused():
            before = _cpu_ticks(child)
            time.sleep(0.5)
            assert _cpu_ticks(child) == before
        assert answered.wait(60), "the thawed spare did not run on"
        worker.join(5)
    finally:
        spares.close()


_HOST_THAT_FREEZES = """
import subprocess, sys, time
from kernel_env.sandbox.limits import Cgroup, Limits
group = Cgroup.create(Limits())
if group is None or group._freezer is None:
    print("no freezer", flush=True)
    sys.exit(0)
sleeper = subprocess.Popen(["sleep", "600"], preexec_fn=group.enter)
assert group.freeze()
print(sleeper.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_processes_a_killed_host_had_frozen_die_with_it():
    """Cgroup v1 freezes a process so that not even SIGKILL ends it before a thaw: a host killed
    during a timing run (a trainer's SIGTERM) must not leave the jobs it froze holding their memory."""
    host = subprocess.Popen([sys.executable, "-c", _HOST_THAT_FREEZES], stdout=subprocess.PIPE, text=True)
    line = host.stdout.readline().strip()
    if line == "no freezer":
        pytest.skip("no cgroup v1 freezer here (cgroup v2 lets a frozen process die)")
    sleeper = int(line)
    assert _running(sleeper)
    host.kill()
    host.wait()
    os.kill(sleeper, signal.SIGKILL)  # what the fork server's death signal does to a job's processes
    groups = lambda: list(Path("/sys/fs/cgroup/freezer/kernel_env").glob(f"kernel_env-{host.pid}-*"))  # noqa: E731
    deadline = time.monotonic() + 15
    while (_running(sleeper) or groups()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(sleeper), "a process the dead host had frozen is still there"
    assert not groups(), "its cgroup is left"


def test_without_a_freezable_cgroup_a_child_is_stopped_by_signal():
    child = Child.spawn("judge", env={}, gpu=False, label="test-freeze")
    cgroup, child._cgroup = child._cgroup, None  # as on a host that gives us no cgroup (the H100 machine here)
    try:
        if child._namespace is None:
            pytest.skip("no bubblewrap here: a child has no pid namespace to stop")
        assert child.freeze()
        before = _cpu_ticks(child)
        states = {Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] for pid in _pids(child)}
        assert states == {"T"}, states
        child.thaw()
        child.call(Setup(device="cpu", out_dir=child.path("/job/ref"),
                         task_code=(example_dir() / "task.py").read_text().replace("1 << 24", "1 << 10")), None, 120)
        assert _cpu_ticks(child) >= before
    finally:
        child._cgroup = cgroup
        child.discard()


@pytest.mark.parametrize("by", ["cgroup", "signal"])
def test_a_timing_run_asks_every_child_to_stop_before_it_waits_for_any(by):
    """Three real children frozen at once (``sharing.freeze_all``: each asked, then each waited for), by
    their cgroups or by signals: all stopped before the run, all running again after."""
    from kernel_env.evaluators.sharing import freeze_all

    children = [Child.spawn("judge", env={}, gpu=False, label="test-freeze") for _ in range(3)]
    cgroups = [child._cgroup for child in children]
    try:
        if by == "signal":
            for child in children:
                child._cgroup = None
        if (by == "cgroup" and None in cgroups) or (by == "signal" and children[0]._namespace is None):
            pytest.skip(f"nothing here stops a child by {by}")
        assert freeze_all(children) == children
        for child in children:
            if by == "signal":
                states = {Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] for pid in _pids(child)}
                assert states == {"T"}, states
            else:
                assert child._cgroup.frozen()
        for child in children:
            child.thaw()
        for child in children:
            child.call(Setup(device="cpu", out_dir=child.path("/job/ref"),
                             task_code=(example_dir() / "task.py").read_text().replace("1 << 24", "1 << 10")), None, 120)
    finally:
        for child, cgroup in zip(children, cgroups):
            child._cgroup = cgroup
            child.discard()


def _pids(child: Child) -> list[int]:
    namespace = os.readlink(f"/proc/{child._namespace.pid}/ns/pid")
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and _namespace_of(e) == namespace]


def _namespace_of(entry: str) -> str | None:
    try:
        return os.readlink(f"/proc/{entry}/ns/pid")
    except OSError:
        return None


def test_a_job_short_of_device_memory_beside_others_is_run_again_alone(monkeypatch):
    """The pool answers such a job with its second run, made while no other job is on the GPU."""
    running, log, lock = set(), [], threading.Lock()

    def fake_evaluate(job, *, device, lease=None, answer=None, **options):
        with lock:
            log.append((job.job_id, lease is not None, sorted(running)))
            running.add(job.job_id)
        time.sleep(1.3)  # longer than a GPU lease's grace: the run alone must wait for the others' ends all the same
        first_big = job.job_id == "big" and lease is not None
        result = EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                            mode=job.mode, correct=not first_big, reward=-1.0 if first_big else 1.0,
                            error="running ModelNew failed: torch.OutOfMemoryError: CUDA out of memory." if first_big else None)
        if answer is not None:
            answer(result)
        with lock:
            running.discard(job.job_id)
        return result

    monkeypatch.setattr(pool_module, "evaluate", fake_evaluate)
    monkeypatch.setattr(pool_module, "reserve_spares", lambda per_role: None)
    monkeypatch.setattr(pool_module, "visible_gpus", lambda: ["cuda:0"])  # the GPU this test pretends to have
    jobs = [EvalJob(job_id=name, task_id="t", task_code="", language="triton", device="cuda", mode=Mode.VERIFY,
                    snapshot_dir=Path("/nonexistent")) for name in ("a", "big", "b", "c", "d")]
    with pool_module.LocalPool(["cuda:0"], jobs_per_gpu=3) as pool:
        futures = {job.job_id: pool.submit(job) for job in jobs}
        results = {name: future.result(timeout=30) for name, future in futures.items()}
    assert all(r.correct and r.reward == 1.0 and r.error is None for r in results.values()), results
    assert [name for name, r in results.items() if pool_module.SHORT_OF_MEMORY_STEP in r.steps_s] == ["big"]
    big = [entry for entry in log if entry[0] == "big"]
    assert [shared for _, shared, _ in big] == [True, False]  # beside others first, then alone
    assert big[1][2] == []  # nothing else ran when the second run began ...
    started_after = log[log.index(big[1]) + 1:]
    assert all("big" not in others for _, _, others in started_after)  # ... nor began beside it
    assert any(others for _, _, others in log)  # the other jobs did share the GPU


@pytest.mark.parametrize("error", [
    "running ModelNew failed: Drive raised torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB",
    "candidate: yardstick failed: Drive raised RuntimeError: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)",
    "running ModelNew failed: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
])
def test_every_way_of_saying_the_device_ran_out_of_memory_is_read_as_such(error):
    result = EvalResult(job_id="j", task_id="t", language="cuda", device="cuda", mode=Mode.FINAL, error=error)
    assert pool_module._short_of_device_memory(result)
    assert not pool_module._short_of_device_memory(result.model_copy(update={"error": "illegal memory access"}))
    assert not pool_module._short_of_device_memory(result.model_copy(update={"device": "cpu"}))


def test_a_harness_error_answers_the_job_as_the_evaluators_fault_and_the_pool_goes_on(monkeypatch):
    """A bug in the harness must still answer its job, with no reward (never a -1 for the
    candidate), and must not stop the pool from evaluating the next one."""
    def fake_evaluate(job, *, device, lease=None, answer=None, **options):
        if job.job_id == "broken":
            raise RuntimeError("a harness bug")
        result = EvalResult(job_id=job.job_id, task_id=job.task_id, language=job.language, device=job.device,
                            mode=job.mode, correct=True, reward=1.0)
        if answer is not None:
            answer(result)
        return result

    monkeypatch.setattr(pool_module, "evaluate", fake_evaluate)
    jobs = [EvalJob(job_id=name, task_id="t", task_code="", language="cpp", device="cpu", mode=Mode.VERIFY,
                    snapshot_dir=Path("/nonexistent")) for name in ("broken", "next")]
    with pool_module.LocalPool(["cpu"]) as pool:
        broken, following = (pool.submit(job).result(timeout=30) for job in jobs)
    assert broken.fault == "evaluator" and broken.reward is None and not broken.correct, broken
    assert "internal evaluation error: RuntimeError: a harness bug" in (broken.error or "")
    assert following.correct and following.fault is None


@pytest.mark.skipif(not shutil.which("bwrap"), reason="no bubblewrap: no pid namespace to look into")
def test_a_namespace_s_processes_are_its_init_s_tree_orphans_and_nested_namespaces_included():
    """``PidNamespace.members`` (what a timing run stops) walks the tree from the namespace's init:
    every process the scan of /proc by namespace finds (an orphan re-parented to the init among
    them), and a nested namespace's processes too, which the scan missed; all of them stopped."""
    from kernel_env.sandbox.bwrap import spawn

    script = "(sleep 300 &); unshare --user --pid --fork sleep 300 & sleep 300"
    proc, namespace = spawn(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-user",
                             "--unshare-pid", "--die-with-parent", "sh", "-c", script])
    try:
        assert namespace is not None
        deadline = time.monotonic() + 10
        while len(namespace.members()) < 5 and time.monotonic() < deadline:  # init, sh, the orphan, unshare, its sleep
            time.sleep(0.05)
        members = set(namespace.members())
        assert set(namespace._members_by_namespace()) < members, "a nested namespace's process is missed by the scan"
        assert namespace.stop() == len(members)
        assert {_state(pid) for pid in members} == {"T"} and namespace.stopped()
        namespace.cont()  # continues exactly those it stopped
        assert "T" not in {_state(pid) for pid in members}
    finally:
        namespace.kill()
        proc.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@pytest.mark.skipif(not shutil.which("bwrap"), reason="no bubblewrap: no pid namespace to look into")
def test_finding_a_namespace_s_processes_reads_its_own_not_every_process_of_the_host():
    """Where no cgroup can be frozen (the GPU machines here), a timing run stops every other job's
    children and the spares by signal, and thaws them after: each time, their processes are found.
    Matching every process of the host by its namespace took ~11 ms a child with 600 processes on
    the host (hundreds of sandboxes run beside a pool); the walk from the init, 0.14 ms. Kept as a
    ratio of the two, measured side by side."""
    import statistics
    import subprocess

    from kernel_env.sandbox import bwrap

    if not bwrap._CHILDREN_LISTS:
        pytest.skip("this kernel lists no children in /proc: the scan is all there is")
    others = [subprocess.Popen(["sleep", "300"]) for _ in range(300)]
    proc, namespace = bwrap.spawn(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-user",
                                   "--unshare-pid", "--die-with-parent", "sleep", "300"])
    try:
        def seconds(find) -> float:
            runs = []
            for _ in range(15):
                began = time.perf_counter()
                found = find()
                runs.append(time.perf_counter() - began)
            assert found and set(found) == set(namespace._members_by_namespace())
            return statistics.median(runs)

        walk, scan = seconds(namespace.members), seconds(namespace._members_by_namespace)
        assert walk * 5 < scan, f"the walk took {walk * 1e3:.2f} ms, the scan {scan * 1e3:.2f} ms"
    finally:
        namespace.kill()
        proc.wait()
        for other in others:
            other.kill()
            other.wait()
