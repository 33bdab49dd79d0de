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

Between its steps a job's children are idle: each command ends with the device synchronised
(``runner.py``). A child that broke that (a thread of its own, launching on) would slow another
job's timing, so every other job's child is frozen, busy or not.

This module never starts a process and never touches a device: it only decides who may.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol


class Freezable(Protocol):
    def freeze(self) -> bool:
        """Stop every process of the child; True once none runs (stopped, or the child has ended),
        False where that is not possible here."""

    def thaw(self) -> None:
        """Let a frozen child's processes run again."""


class DeviceLease:
    """Who may use one device now: any number of untimed steps, or one timing run.

    ``register``/``unregister`` keep the live children of every job on the device, so a timing
    run can freeze the others' (``timing(own=...)`` leaves the caller's own children alone).
    ``account()`` says how long the lease has spent in each of its states, ``stragglers``
    how many untimed steps a timing run has frozen mid-step (their grace ran out), and
    ``freezing_s`` how much of the timing runs' time went to freezing and thawing other jobs'
    children (where no cgroup can be frozen, a stop signal to each process of their namespaces).

    Args:
        grace_s: how long a timing run waits for an untimed step in flight, counted from the
            step's start, before freezing it (the local pool: 1 s on a GPU, 0 on the CPU)."""

    STATES = ("timing", "draining", "untimed", "idle")

    def __init__(self, grace_s: float = 1.0) -> None:
        self.grace_s = grace_s
        self.stragglers = 0
        self.freezing_s = 0.0
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
        mine, claimed = list(own), False
        with self._cv:
            self._tick()
            self._waiting += 1
            try:
                self._cv.wait_for(lambda: not self._timing)
                self._timing = claimed = True  # no other timing run from here; untimed steps in flight may still end
                drained = self._cv.wait_for(lambda: self._untimed == 0) if drain else self._wait_for_young_steps()
                others = [child for child in self._children if not any(child is m for m in mine)]
                began = time.monotonic()
                frozen = [child for child in others if child.freeze()]
                if not drained and len(frozen) < len(others):  # one cannot be frozen: it must end of itself
                    for child in frozen:
                        child.thaw()
                    self._cv.wait_for(lambda: self._untimed == 0)
                    frozen = [child for child in others if child.freeze()]
                elif not drained:
                    self.stragglers += self._untimed
                self.freezing_s += time.monotonic() - began
            except BaseException:
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
            with self._cv:
                self.freezing_s += time.monotonic() - began
                self._tick()
                self._timing = self._measuring = False
                self._cv.notify_all()

    def register(self, child: Freezable) -> None:
        """A live child of a job on this device: frozen by other jobs' timing runs until ``unregister``."""
        with self._cv:
            self._children.append(child)

    def unregister(self, child: Freezable) -> None:
        with self._cv:
            self._children = [c for c in self._children if c is not child]
