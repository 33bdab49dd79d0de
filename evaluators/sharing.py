"""How evaluation jobs share one GPU: their untimed steps together, a timing run alone.

A job spends seconds on work that measures nothing (children starting, the task and ModelNew
loading, the correctness trials, the parent comparing their outputs) and a fraction of a second
timing. Timing must have the device to itself, so the local pool used to run one whole job per
GPU at a time, and the GPU sat idle through everything else. With a ``DeviceLease`` several jobs
run on one GPU at once: any number of untimed steps together, and a timing run (the baselines',
the candidate's) alone. A timing run waits until every untimed step in flight has ended, and no
new one starts until it is over (timing runs go first, so they are never starved).

Between its steps a job's children are idle: each command ends with the device synchronised
(``runner.py``), so nothing a finished step launched is still running when a timing run starts.
A child that broke that protocol (a thread of its own, launching on) would slow another job's
timing, so while a run times, the children of every other job on the device are frozen through
their cgroups where this host lets us freeze them (and the thread is a violation of its own job
either way).

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
        """Stop every process of the child; True once they are stopped (False: not possible here)."""

    def thaw(self) -> None:
        """Let a frozen child's processes run again."""


class DeviceLease:
    """Who may use one device now: any number of untimed steps, or one timing run.

    ``register``/``unregister`` keep the live children of every job on the device, so a timing
    run can freeze the others' (``timing(own=...)`` leaves the caller's own children alone).
    ``account()`` says how long the lease has spent in each of its states."""

    STATES = ("timing", "draining", "untimed", "idle")

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._untimed = 0
        self._timing = False
        self._waiting = 0
        self._children: list[Freezable] = []
        self._seconds = dict.fromkeys(self.STATES, 0.0)
        self._since = time.monotonic()

    def _tick(self) -> None:
        """Charge the time since the last change to the state it was spent in (call under the lock,
        before a change): "timing" (a timing run holds the device), "draining" (a timing run waits
        for untimed steps to end, and no new one starts), "untimed" (untimed steps only), "idle"."""
        now = time.monotonic()
        state = ("timing" if self._timing else "draining" if self._waiting and self._untimed
                 else "untimed" if self._untimed else "idle")
        self._seconds[state] += now - self._since
        self._since = now

    def account(self) -> dict[str, float]:
        """Seconds spent so far in each state (``STATES``), from the lease's creation."""
        with self._cv:
            self._tick()
            return dict(self._seconds)

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """A step that measures nothing: it runs beside other jobs' untimed steps, never beside a timing run."""
        with self._cv:
            self._cv.wait_for(lambda: not self._timing and not self._waiting)
            self._tick()
            self._untimed += 1
        try:
            yield
        finally:
            with self._cv:
                self._tick()
                self._untimed -= 1
                self._cv.notify_all()

    @contextlib.contextmanager
    def timing(self, own: Iterable[Freezable] = ()) -> Iterator[None]:
        """A timing run: the device to itself, every other job's children frozen where possible."""
        mine = list(own)
        with self._cv:
            self._tick()
            self._waiting += 1
            try:
                self._cv.wait_for(lambda: not self._timing and self._untimed == 0)
            finally:
                self._tick()
                self._waiting -= 1
            self._timing = True
            others = [child for child in self._children if not any(child is m for m in mine)]
        frozen = []
        try:
            frozen = [child for child in others if child.freeze()]
            yield
        finally:
            for child in frozen:
                child.thaw()
            with self._cv:
                self._tick()
                self._timing = False
                self._cv.notify_all()

    def register(self, child: Freezable) -> None:
        with self._cv:
            self._children.append(child)

    def unregister(self, child: Freezable) -> None:
        with self._cv:
            self._children = [c for c in self._children if c is not child]
