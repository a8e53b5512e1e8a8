"""The judge: `python -m htam_engine.evaluate.judge JOBDIR`, the trusted side's hands.

It runs outside the sandbox and never imports the candidate. It draws the seeds and
makes every input itself (they exist only in its memory and, one call at a time, in the
box of the worker being called), computes the expected outputs (float32 and float64),
and drives two sandboxed workers that run the same harness: one holds the reference,
the other the candidate. Each call is timed by this process's clock from `go` to `done`;
then the worker's whole process tree is stopped and its outputs are read from its box,
so nothing it does afterwards can finish or change them. Verification and timing are
the same kind of call; timed outputs at random positions, and the last, are judged.
Only lines carrying the caller's token (its first stdin line) reach the caller.

This module is the process's entry and imports no torch: it starts both workers first,
then imports its own side (`judging`), whose torch import then runs beside theirs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from htam_engine.evaluate import protocol
from htam_engine.evaluate.jobspec import ROLES, Conditions, JobSpec
from htam_engine.evaluate.process import Stop, descendants, signal_all
from htam_engine.evaluate.side import Side
from htam_engine.vocabulary import ErrorKind

_PR_SET_CHILD_SUBREAPER = 36


def _close(sides: dict[str, Side], reap: bool = True) -> None:
    """Kill both workers and anything left below this process (daemons that left
    their worker come back to it: it is their subreaper)."""
    for side in sides.values():
        side.child.kill(reap)
    signal_all(descendants(os.getpid()), signal.SIGKILL)


def _die_cleanly(jobdir: Path, sides: dict[str, Side]) -> None:
    """SIGTERM's handler (the caller died): it takes no lock, and exits without reaping."""
    _close(sides, reap=False)
    shutil.rmtree(jobdir, ignore_errors=True)
    os._exit(1)


def main(jobdir: Path) -> None:
    """Start both workers from `conditions.json` at once and, once the caller says
    `prepare`, the reference's side of the job in `standby.json`; then wait for the
    caller's `job` line: a judge can stand by, ready, before its task is known (the
    caller writes `reference.py` and `standby.json` before its first command) and before
    its candidate exists (`standby`); it serves one job and ends. Before the job it
    sizes the problem whenever asked (`protocol.SIZE`)."""
    token = sys.stdin.readline().strip()
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of the workers come back to us
    sides: dict[str, Side] = {}
    signal.signal(signal.SIGTERM, lambda *_: _die_cleanly(jobdir, sides))
    conditions = Conditions.from_json(json.loads((jobdir / "conditions.json").read_text()))
    _cap_memory(conditions)
    try:
        sides.update((role, Side(role, jobdir, conditions)) for role in ROLES)
        from htam_engine.evaluate.judging import Judge  # torch, beside the workers' imports

        if _command(token, jobdir) != protocol.PREPARE:
            raise SystemExit(0)
        ahead = _standby(jobdir, conditions)
        with _reference_code("preparing the inputs"):
            judge = Judge(jobdir, ahead, token, sides)
            judge.prepare()
        if _command(token, jobdir) != protocol.JOB:
            raise SystemExit(0)
        judge.take(JobSpec.from_json(json.loads((jobdir / "job.json").read_text())))
        judge.run()
    except SystemExit:
        pass
    except Stop as stop:
        _say(token, protocol.Failed(stop.kind, stop.message, stop.log, stop.line))
    except Exception as error:  # this side's own failure: no candidate is judged by it
        message = f"the judge failed: {type(error).__name__}: {error}"[:600]
        _say(token, protocol.Failed(ErrorKind.EVALUATOR_ERROR, message))
    finally:
        _close(sides)


def _standby(jobdir: Path, conditions: Conditions) -> JobSpec:
    """The job known ahead of its candidate; its workers were started under `conditions`."""
    standby = JobSpec.from_json(json.loads((jobdir / "standby.json").read_text()))
    if standby.conditions != conditions:
        message = "the job does not match the conditions the judge has"
        raise Stop(ErrorKind.EVALUATOR_ERROR, message)
    return standby


@contextlib.contextmanager
def _reference_code(doing: str) -> Iterator[None]:
    """Where the judge runs the reference's own code: its failure is the reference's."""
    try:
        yield
    except Stop:
        raise
    except Exception as error:
        message = f"the reference failed {doing}: {type(error).__name__}: {error}"[:600]
        raise Stop(ErrorKind.REFERENCE_ERROR, message) from None


def _command(token: str, jobdir: Path) -> str:
    """The caller's next command, each `SIZE` before it answered on the way."""
    from htam_engine.evaluate.judging import sizes_on_meta

    while (command := sys.stdin.readline().strip()) == protocol.SIZE:
        _say(token, sizes_on_meta(jobdir / "reference.py"))
    return command


def _say(token: str, message: protocol.Message) -> None:
    print(json.dumps({**protocol.encode(message), "token": token}), flush=True)


def _cap_memory(conditions: Conditions) -> None:
    """The judge's own address space, capped as a CPU worker's is (on a GPU the CUDA
    driver maps far more than it uses: no cap there). Its memory depends on the problem
    only: every message of a worker is capped (`process.MAX_LINE`), and outputs are
    read in the layout the judge expects."""
    if conditions.device == "cpu":
        size = conditions.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
