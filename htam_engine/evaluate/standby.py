"""One judge started ahead (the judges and their job folders: `jobfolder`).

A judge and its two sandboxed workers take about two seconds to start (three Python
interpreters importing torch), and the judge's input sets and expected outputs a few
tenths more: most of what a candidate costs besides its own compile and timing. All of
it depends on the task, never on the candidate, so a process that evaluates one
candidate after another (the loop, a sweep) can keep one spare started in the
background (`keep_warm`): the next evaluation of the same task and limits takes it, and
a new spare is started once that evaluation is over (never while it is timed). A spare
has seen no candidate: its workers wait, having imported nothing of any task, the judge
made its inputs before the code that meets them existed, and every judge serves one job
and is killed with its folder, so isolation is what it is without the spare.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator

from htam_engine.evaluate import keeper, protocol
from htam_engine.evaluate.jobfolder import Started, launch
from htam_engine.evaluate.jobspec import JobSpec
from htam_engine.evaluate.process import Stop


def start(ahead: JobSpec, reference: str, held: bool = False) -> Started:
    """A judge for the task `ahead` of `reference`: a keeper's, lent, or else one started
    now; `held`, it only starts its workers and imports torch until `prepare`."""
    started = keeper.borrow(ahead.conditions) or launch(ahead.conditions)
    started.assign(ahead, reference)
    if not held:
        started.prepare()
    return started


class _Spare:
    """The one judge this process keeps started ahead, if asked to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.warm = False
        self.started: Started | None = None

    def take(self, ahead: JobSpec, reference: str) -> Started:
        with self.lock:
            spare, self.started = self.started, None
        if spare is not None and spare.fits(ahead, reference):
            spare.prepare()
            return spare
        if spare is not None:
            spare.finish()
        return start(ahead, reference)

    def refill(self, ahead: JobSpec, reference: str) -> None:
        if self.warm:
            self.fill(ahead, reference)

    def fill(self, ahead: JobSpec, reference: str) -> None:
        with self.lock:
            if self.started is None:
                self.started = start(ahead, reference)

    def size(self, ahead: JobSpec, reference: str, limit_s: float) -> protocol.Sized:
        with self.lock:
            if self.started is not None and not self.started.fits(ahead, reference):
                self.started.finish()
                self.started = None
            if self.started is None:
                self.started = start(ahead, reference, held=True)
            started = self.started
        try:
            return started.size(limit_s)
        except Stop as stop:  # the problem stays unsized; the evaluation says what failed
            self.release()
            return protocol.Sized(None, None, f"no estimate: {stop.message}")

    def release(self) -> None:
        with self.lock:
            spare, self.started = self.started, None
        if spare is not None:
            spare.finish()


_SPARE = _Spare()
atexit.register(_SPARE.release)


def keep_warm(on: bool) -> None:
    """Keep a judge started ahead for the next evaluation (off: none, and the spare
    is killed)."""
    _SPARE.warm = on
    if not on:
        _SPARE.release()


def prefill(ahead: JobSpec, reference: str) -> None:
    """Start the spare for the job `ahead` now, before any evaluation asked for one; with
    `keep_warm` on, each evaluation is followed by a new spare."""
    _SPARE.fill(ahead, reference)


def size(ahead: JobSpec, reference: str, limit_s: float) -> protocol.Sized:
    """The problem's sizes, measured by the spare (started now for the job `ahead`, held,
    if none fits): the judge the next evaluation takes sizes its problem first, and a held
    one has made no input set (memory the sizes may refuse) when it answers."""
    return _SPARE.size(ahead, reference, limit_s)


@contextlib.contextmanager
def judge_for(ahead: JobSpec, reference: str) -> Iterator[Started]:
    """A started judge for one job (the spare when it fits), finished afterwards; a new
    spare is started after it when `keep_warm` is on."""
    started = _SPARE.take(ahead, reference)
    try:
        yield started
    finally:
        started.finish()
        _SPARE.refill(ahead, reference)
