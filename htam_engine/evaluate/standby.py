"""Job folders and the judges that serve them, with one judge started ahead.

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
import fcntl
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htam_engine import machine
from htam_engine.evaluate import protocol
from htam_engine.evaluate.process import Child, Stop, python_module
from htam_engine.paths import held, subdir

ROLES = ("reference", "candidate")
_BOX_FOLDERS = ("tmp", "build", "cache", "torch_extensions")


CONDITIONS = ("device", "backend", "threads", "memory_mb")  # what a judge starts under


def conditions_of(ahead: dict[str, Any]) -> dict[str, Any]:
    """What a judge and its workers are started under, whatever the task."""
    return {key: ahead[key] for key in CONDITIONS}


@dataclass
class Started:
    """A judge, started in its own job folder under `conditions`, waiting for its task
    (`assign`) and then for its candidate; `job` is `ahead` with the judge's init seed."""

    jobdir: Path
    judge: Child
    conditions: dict[str, Any]
    owner: int  # the folder's lock, held while the judge lives
    ahead: dict[str, Any] | None = None  # the job known before the candidate, once assigned
    reference: str = ""
    job: dict[str, Any] = field(default_factory=dict)
    held: bool = True  # its input sets not yet made: `prepare` lets it
    give_back: Callable[[], None] | None = None  # lent by a keeper: this returns it

    def assign(self, ahead: dict[str, Any], reference: str) -> None:
        """Give the judge its task (once, before `size` or `prepare`)."""
        assert self.ahead is None and conditions_of(ahead) == self.conditions
        self.ahead, self.reference = ahead, reference
        self.job = {**ahead, "init_seed": secrets.randbelow(2**31)}
        (self.jobdir / "reference.py").write_text(reference)
        (self.jobdir / "standby.json").write_text(json.dumps(self.job))

    def prepare(self) -> None:
        """Let the judge make its input sets and expected outputs (once)."""
        if self.held:
            self.judge.send(protocol.PREPARE)
            self.held = False

    def size(self, limit_s: float) -> protocol.Sized:
        """The problem's sizes, as the judge measures them on meta tensors (it makes
        nothing); `Stop` if it fails or takes over `limit_s`."""
        self.judge.send(protocol.SIZE)
        found = self.judge.wait_for(protocol.Sized.EVENT, limit_s, "sizing", threading.Event())
        return protocol.decode(found, protocol.Sized)

    def fits(self, ahead: dict[str, Any], reference: str) -> bool:
        alive = self.judge.popen.poll() is None
        return alive and self.ahead == ahead and self.reference == reference

    def finish(self) -> None:
        self.judge.kill()
        shutil.rmtree(self.jobdir, ignore_errors=True)
        os.close(self.owner)
        if self.give_back is not None:
            self.give_back()


def launch(
    conditions: dict[str, Any], listen: bool = True, env: dict[str, str] | None = None
) -> Started:
    """A new job folder (both boxes, `conditions.json`) and its judge, started in `env`
    (default: `judge_env()`): it starts its workers and imports torch, and waits for its
    task; `listen` off, its output is left for the process it is lent to (`keeper`)."""
    clean_stale_jobs()
    jobdir = Path(tempfile.mkdtemp(prefix="eval-", dir=subdir("jobs")))
    owner = os.open(jobdir / ".owner", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    for role in ROLES:
        for folder in _BOX_FOLDERS:
            (jobdir / role / folder).mkdir(parents=True)
    (jobdir / "conditions.json").write_text(json.dumps(conditions))
    judge = Child(
        "judge",
        python_module("htam_engine.evaluate.judge", str(jobdir)),
        jobdir,
        judge_env() if env is None else env,
        jobdir / "judge.log",
        token=secrets.token_hex(16),
        death_signal=signal.SIGTERM,  # it cleans up the job folder when the caller dies
        listen=listen,
    )
    return Started(jobdir, judge, conditions, owner)


def start(ahead: dict[str, Any], reference: str, held: bool = False) -> Started:
    """A judge for the task `ahead` of `reference`: a keeper's, lent, or else one started
    now; `held`, it only starts its workers and imports torch until `prepare`."""
    from htam_engine.evaluate import keeper  # it lends what this module starts

    started = keeper.borrow(conditions_of(ahead)) or launch(conditions_of(ahead))
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

    def take(self, ahead: dict[str, Any], reference: str) -> Started:
        with self.lock:
            spare, self.started = self.started, None
        if spare is not None and spare.fits(ahead, reference):
            spare.prepare()
            return spare
        if spare is not None:
            spare.finish()
        return start(ahead, reference)

    def refill(self, ahead: dict[str, Any], reference: str) -> None:
        if self.warm:
            self.fill(ahead, reference)

    def fill(self, ahead: dict[str, Any], reference: str) -> None:
        with self.lock:
            if self.started is None:
                self.started = start(ahead, reference)

    def size(self, ahead: dict[str, Any], reference: str, limit_s: float) -> protocol.Sized:
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


def prefill(ahead: dict[str, Any], reference: str) -> None:
    """Start the spare for the job `ahead` now, before any evaluation asked for one; with
    `keep_warm` on, each evaluation is followed by a new spare."""
    _SPARE.fill(ahead, reference)


def size(ahead: dict[str, Any], reference: str, limit_s: float) -> protocol.Sized:
    """The problem's sizes, measured by the spare (started now for the job `ahead`, held,
    if none fits): the judge the next evaluation takes sizes its problem first, and a held
    one has made no input set (memory the sizes may refuse) when it answers."""
    return _SPARE.size(ahead, reference, limit_s)


@contextlib.contextmanager
def judge_for(ahead: dict[str, Any], reference: str) -> Iterator[Started]:
    """A started judge for one job (the spare when it fits), finished afterwards; a new
    spare is started after it when `keep_warm` is on."""
    started = _SPARE.take(ahead, reference)
    try:
        yield started
    finally:
        started.finish()
        _SPARE.refill(ahead, reference)


def _stale(folder: Path) -> bool:
    """A job folder whose evaluation is gone (its owner's lock is free)."""
    try:
        descriptor = os.open(folder / ".owner", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return time.time() - folder.stat().st_mtime > 60  # not yet (or never) locked
    return not held(descriptor)


def clean_stale_jobs() -> int:
    """Remove the job folders of evaluations that died; the number removed."""
    removed = 0
    for folder in subdir("jobs").iterdir():
        with contextlib.suppress(OSError):
            if folder.is_dir() and _stale(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
    return removed


def judge_env() -> dict[str, str]:
    """The judge is trusted but needs no secrets either (`machine.trusted_env`)."""
    env = machine.trusted_env()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
