"""Job folders and the judges started in them: each judge serves one job and goes with
its folder (`Started.finish`); folders of evaluations that died are removed
(`clean_stale_jobs`). A judge is started under its conditions only and given its task
later, so it can be started ahead (`standby`) or kept between commands (`keeper`).
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from htam_engine import machine, procs
from htam_engine.evaluate import protocol
from htam_engine.evaluate.jobspec import ROLES, Conditions, JobSpec
from htam_engine.evaluate.process import Child, python_module
from htam_engine.paths import held, subdir

_BOX_FOLDERS = ("tmp", "build", "cache", "torch_extensions")


@dataclass
class Started:
    """A judge, started in its own job folder under `conditions`, waiting for its task
    (`assign`) and then for its candidate; `job` is `ahead` with the judge's init seed."""

    jobdir: Path
    judge: Child
    conditions: Conditions
    owner: int  # the folder's lock, held while the judge lives
    ahead: JobSpec | None = None  # the job known before the candidate, once assigned
    reference: str = ""
    job: JobSpec | None = None  # `ahead`, seeded, once assigned
    held: bool = True  # its input sets not yet made: `prepare` lets it
    give_back: Callable[[], None] | None = None  # lent by a keeper: this returns it

    def assign(self, ahead: JobSpec, reference: str) -> None:
        """Give the judge its task (once, before `size` or `prepare`)."""
        assert self.ahead is None and ahead.conditions == self.conditions
        self.ahead, self.reference = ahead, reference
        self.job = ahead.seeded(secrets.randbelow(2**31))
        (self.jobdir / "reference.py").write_text(reference)
        (self.jobdir / "standby.json").write_text(json.dumps(self.job.to_json()))

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

    def fits(self, ahead: JobSpec, reference: str) -> bool:
        alive = self.judge.popen.poll() is None
        return alive and self.ahead == ahead and self.reference == reference

    def finish(self) -> None:
        self.judge.kill()
        procs.kill_naming(str(self.jobdir))  # a sandbox its reaper's death left behind
        shutil.rmtree(self.jobdir, ignore_errors=True)
        os.close(self.owner)
        if self.give_back is not None:
            self.give_back()


def launch(
    conditions: Conditions, listen: bool = True, env: dict[str, str] | None = None
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
    (jobdir / "conditions.json").write_text(json.dumps(conditions.to_json()))
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
