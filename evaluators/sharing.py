"""How evaluation jobs share one device: their untimed steps together, a timing run alone.

- ``DeviceLease``: who may use one device now: any number of untimed steps (children starting,
  loading, trials, comparisons), or one timing run with every other job's children frozen.
- ``Freezable``: what the lease freezes (``children.Child``: through its cgroup, else with a stop
  signal to each process of its pid namespace).

A timing run waits for each untimed step in flight until it has run ``grace_s`` in all, freezes
one still running then where it stands, and lets no new one start until it is over (timing runs go
first, so they are never starved). Where a child cannot be frozen (no isolation on this host) it
waits for every step to end. Why, the device probe and ``drain``, and what it costs:
docs/design.md, Jobs sharing a device.

Where it stands is never inside a call between a job's judge and worker (``Freezable.pause_calls``):
on a GPU a call queues work on two processes' streams that waits for the other's (the call word, the
done word), and a process frozen there leaves a context waiting on the device, which costs every
call of the timing run beside it microseconds (``benchmarks/done_word.py``, the stalled conditions).
A timing run waits for the calls in flight to end, up to ``call_wait_s``, and keeps new ones from
starting until it is over.

Between its steps a job's children are idle: each command ends with the device synchronised
(``runner.py``). A worker that broke that (the candidate's thread, launching on) would slow another
job's timing, so every other job's worker is stopped, busy or not. A judge runs only the harness's
code: one between commands waits on its stdin, and is held rather than stopped (``Freezable.held``,
``children.Child.freeze``): no command reaches it until the timing run is over, and it costs the run
nothing (no signal to each of its processes, no wait until each has stopped).

This module never starts a process and never touches a device: it only decides who may.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol


#: How often a timing run looks again whether a call in flight has ended (calls take milliseconds).
_CALL_POLL_S = 0.0005


class Freezable(Protocol):
    #: Frozen by a hold, not a stop: an idle child that runs only trusted code starts nothing until thawed.
    held: bool

    def freeze(self, wait: bool = True) -> bool:
        """Stop every process of the child, or hold an idle trusted one (``held``); True once none runs
        (stopped, held, or the child has ended), False where that is not possible here.
        ``wait=False``: only ask (True where asked), and ``wait_frozen`` waits."""

    def wait_frozen(self) -> bool:
        """After ``freeze(wait=False)``: True once none of the child's processes runs, False (thawed)
        where they did not stop."""

    def thaw(self) -> None:
        """Let a frozen child's processes run again."""

    def pause_calls(self) -> bool:
        """Keep the child from starting a call with another process; True once it is in none (then
        until ``resume_calls``), False while a call of its is still in flight (ask again: no new one
        starts meanwhile)."""

    def resume_calls(self) -> None:
        """Let a child asked to ``pause_calls`` start calls again (whether it paused or not)."""


class DeviceLease:
    """Who may use one device now: any number of untimed steps, or one timing run.

    ``register``/``unregister`` keep the live children of every job on the device, so a timing
    run can freeze the others' (``timing(own=...)`` leaves the caller's own children alone).
    ``account()`` says how long the lease has spent in each of its states, ``stragglers``
    how many untimed steps a timing run has frozen mid-step (their grace ran out), ``freezing_s``
    how much of the timing runs' time went to freezing and thawing other jobs' children, by part
    ("waiting for calls", "stopping": where no cgroup can be frozen, a stop signal to each process of
    their namespaces and the wait until each has stopped, "continuing"), ``stopped`` and ``held``
    how many children were frozen each way (``Freezable.held``), and ``frozen_in_call`` how many
    were frozen inside a call all the same (it outlasted ``call_wait_s``).

    Args:
        grace_s: how long a timing run waits for an untimed step in flight, counted from the
            step's start, before freezing it (the local pool: 0.1 s on a GPU, 0 on the CPU).
        call_wait_s: how long it then waits for the calls in flight to end, at most."""

    STATES = ("timing", "draining", "untimed", "idle")
    FREEZING = ("waiting for calls", "stopping", "continuing")

    def __init__(self, grace_s: float = 1.0, call_wait_s: float = 1.0) -> None:
        self.grace_s, self.call_wait_s = grace_s, call_wait_s
        self.stragglers = 0
        self.frozen_in_call = 0
        self.freezing_s = dict.fromkeys(self.FREEZING, 0.0)
        self.stopped = self.held = 0
        self._cv = threading.Condition()
        self._untimed = 0
        self._started: dict[int, float] = {}  # each untimed step in flight: when it began
        self._timing = False  # a timing run has the device (it may still be draining untimed steps)
        self._measuring = False  # ... and is measuring
        self._waiting = 0
        self._children: list[Freezable] = []
        self._seconds = dict.fromkeys(self.STATES, 0.0)
        self._since = time.monotonic()

    def _tick(self) -> None:
        """Charge the time since the last change to the state it was spent in (call under the lock,
        before a change): "timing" (a timing run holds the device), "draining" (a timing run waits
        for untimed steps to end, and no new one starts), "untimed" (untimed steps only), "idle"."""
        now = time.monotonic()
        state = ("timing" if self._measuring else "draining" if self._waiting and self._untimed
                 else "untimed" if self._untimed else "idle")
        self._seconds[state] += now - self._since
        self._since = now

    def account(self) -> dict[str, float]:
        """How the lease's time went.

        Returns:
            Seconds spent so far in each state of ``STATES``, from the lease's creation: "timing" (a
            timing run measures), "draining" (a timing run waits for untimed steps to end), "untimed"
            (untimed steps only), "idle"."""
        with self._cv:
            self._tick()
            return dict(self._seconds)

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """A step that measures nothing: it runs beside other jobs' untimed steps, never beside a timing
        run. Use it as a context manager around the step; it waits while a timing run holds the
        device or waits for it."""
        token = object()
        with self._cv:
            self._cv.wait_for(lambda: not self._timing and not self._waiting)
            self._tick()
            self._untimed += 1
            self._started[id(token)] = time.monotonic()
        try:
            yield
        finally:
            with self._cv:
                self._tick()
                self._untimed -= 1
                del self._started[id(token)]
                self._cv.notify_all()

    def _wait_for_young_steps(self) -> bool:
        """Wait (under the lock) until every untimed step in flight has ended or has run
        ``grace_s`` in all; True when none is left."""
        while self._started:
            youngest = max(self._started.values())
            left = self.grace_s - (time.monotonic() - youngest)
            if left <= 0:
                return False
            self._cv.wait(timeout=left)
        return True

    @contextlib.contextmanager
    def timing(self, own: Iterable[Freezable] = (), drain: bool = False) -> Iterator[None]:
        """A timing run: the device to itself, every other job's children frozen where possible. Use
        it as a context manager around the run; the children are thawed when it exits.

        Untimed steps that have run ``grace_s`` in all are frozen mid-step, unless one of the
        children cannot be frozen, or ``drain``: then the run waits for them to end.

        Args:
            own: the caller's own children, left running.
            drain: wait for every untimed step in flight to end, however long (a run made again
                because another process's kernel held the device)."""
        mine, claimed, paused, frozen = list(own), False, [], []
        with self._cv:
            self._tick()
            self._waiting += 1
            try:
                self._cv.wait_for(lambda: not self._timing)
                self._timing = claimed = True  # no other timing run from here; untimed steps in flight may still end
                drained = self._cv.wait_for(lambda: self._untimed == 0) if drain else self._wait_for_young_steps()
                others = [child for child in self._children if not any(child is m for m in mine)]
                began = time.monotonic()
                paused = self._pause_calls(others)
                asked = time.monotonic()
                frozen = freeze_all(others)
                if not drained and len(frozen) < len(others):  # one cannot be frozen: it must end of itself
                    for child in frozen:
                        child.thaw()
                    for child in paused:  # its step's calls must go on for it to end
                        child.resume_calls()
                    frozen, paused = [], []
                    self._cv.wait_for(lambda: self._untimed == 0)
                    paused = self._pause_calls(others)
                    asked = time.monotonic()
                    frozen = freeze_all(others)
                elif not drained:
                    self.stragglers += self._untimed
                held = sum(child.held for child in frozen)
                self.held, self.stopped = self.held + held, self.stopped + len(frozen) - held
                self.freezing_s["waiting for calls"] += asked - began
                self.freezing_s["stopping"] += time.monotonic() - asked
            except BaseException:
                for child in frozen:
                    child.thaw()
                for child in paused:
                    child.resume_calls()
                if claimed:
                    self._timing = False
                    self._cv.notify_all()
                raise
            finally:
                self._tick()
                self._waiting -= 1
                self._measuring = claimed
        try:
            yield
        finally:
            began = time.monotonic()
            for child in frozen:
                child.thaw()
            for child in paused:
                child.resume_calls()
            with self._cv:
                self.freezing_s["continuing"] += time.monotonic() - began
                self._tick()
                self._timing = self._measuring = False
                self._cv.notify_all()

    def _pause_calls(self, children: list[Freezable]) -> list[Freezable]:
        """Pause every child's calls (under the lock, which it lets go while it waits), waiting up to
        ``call_wait_s`` for those in flight to end; returns the children to resume. A child still in a
        call then is frozen in it all the same (``frozen_in_call``): a call may hang, and a hung sample
        must cost the others no more than this wait."""
        paused, waiting = [], list(children)
        deadline = time.monotonic() + self.call_wait_s
        try:
            while True:
                still = []
                for child in waiting:
                    (paused if child.pause_calls() else still).append(child)
                waiting = still
                if not waiting or time.monotonic() >= deadline:
                    break
                self._cv.wait(timeout=_CALL_POLL_S)
        except BaseException:  # a child asked holds its gate until resumed, paused or not
            for child in children:
                child.resume_calls()
            raise
        self.frozen_in_call += len(waiting)
        return paused + waiting

    def register(self, child: Freezable) -> None:
        """A live child of a job on this device: frozen by other jobs' timing runs until ``unregister``."""
        with self._cv:
            self._children.append(child)

    def unregister(self, child: Freezable) -> None:
        with self._cv:
            self._children = [c for c in self._children if c is not child]


def freeze_all(children: Iterable[Freezable]) -> list[Freezable]:
    """Freeze ``children``, every one asked before any is waited for; returns those frozen."""
    asked = []
    try:
        for child in children:
            if child.freeze(wait=False):
                asked.append(child)
        return [child for child in asked if child.wait_frozen()]
    except BaseException:
        for child in asked:
            child.thaw()
        raise
