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
import fcntl
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from htam_engine.evaluate import accounting, protocol, sandbox
from htam_engine.evaluate.process import Child, Stop, descendants, python_module, signal_all
from htam_engine.procs import ancestors

ROLES = ("reference", "candidate")
_PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def timing_lock(device: str) -> Iterator[None]:
    """One timing at a time per device on this machine (not per HTAM home): a file lock
    in the system's temporary folder, released when this process dies."""
    folder = Path(tempfile.gettempdir()) / "htam-locks"
    folder.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        folder.chmod(0o1777)
    path = folder / f"timing-{device}.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


class Side:
    """One sandboxed worker, its box and this process's view of the box's buffers."""

    def __init__(self, role: str, jobdir: Path, job: dict[str, Any]) -> None:
        """Start the worker from `job`'s device, threads, memory and backend (it waits
        for the job, and imports nothing of it until `load`)."""
        self.role = role
        self.box = jobdir / role
        argv = python_module("htam_engine.evaluate.worker", str(self.box), role)
        memory = job["memory_mb"] if job["device"] == "cpu" else None
        self.child = Child(
            role,
            sandbox.command(argv, self.box, job["device"]),
            self.box,
            _environment(self.box, job),
            self.box / "worker.log",
            memory_mb=memory,
            death_signal=signal.SIGTERM,  # to its reaper: kill the whole tree
        )
        self.calls = 0
        self.main: int | None = None  # the worker's own process, found at its first call
        self.above: frozenset[int] | None = None  # the processes above it (`sandbox`)
        self.core: int | None = None  # the core it is pinned to while timed
        self.canaries = 0  # canary ops asked for: its op record must hold them all

    def books(self, members: list[int]) -> accounting.Books | None:
        """The kernel's accounting of the worker's processes `members`."""
        if self.main is None:
            self.main = accounting.main_process(members)
        return accounting.read(self.main, members) if self.main else None

    def sandbox(self, members: list[int]) -> frozenset[int]:
        """The processes of `members` above the worker's own: the sandbox's, which no
        candidate code runs in (a process's ancestors never change while it lives)."""
        if self.main is None:
            return frozenset()
        if self.above is None:
            self.above = frozenset(ancestors(self.main))
        return frozenset(pid for pid in members if pid in self.above)

    def make_buffers(self, sizes: tuple[int, int]) -> None:
        """Before `load`, so no candidate code has run that could have planted them."""
        self.in_size, self.out_size = max(sizes[0], 1), max(sizes[1], 1)
        self.infile = _buffer(self.box / "in.bin", self.in_size)
        self.outfile = _buffer(self.box / "out.bin", self.out_size)

    def tracked(self) -> None:
        """Every process the worker made is below its reaper, unless the worker killed
        the reaper (possible without bwrap): then the tree is out of reach."""
        if self.child.popen.poll() is not None:
            raise Stop("cheating", f"process.tracking: the {self.role} killed its reaper")


def _environment(box: Path, job: dict[str, Any]) -> dict[str, str]:
    env = sandbox.environment(box, job["threads"])
    if job["backend"] == "triton":
        from htam_engine import triton_backend  # tree-sitter: not before other workers start

        env.update(triton_backend.environment(job["device"], box))
    return env


def _buffer(path: Path, size: int) -> int:
    """A fresh buffer file at `path`, created before any worker can touch it; this
    process reads and writes it through the descriptor (never a shared mapping)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.ftruncate(descriptor, size)
    return descriptor


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
    conditions = json.loads((jobdir / "conditions.json").read_text())
    _cap_memory(conditions)
    try:
        sides.update((role, Side(role, jobdir, conditions)) for role in ROLES)
        from htam_engine.evaluate.judging import Judge  # torch, beside the workers' imports

        if _command(token, jobdir) != protocol.PREPARE:
            raise SystemExit(0)
        with _reference_code("preparing the inputs"):
            judge = Judge(jobdir, _standby(jobdir, conditions), token, sides)
            judge.prepare()
        if _command(token, jobdir) != protocol.JOB:
            raise SystemExit(0)
        judge.take(json.loads((jobdir / "job.json").read_text()))
        judge.run()
    except SystemExit:
        pass
    except Stop as stop:
        _say(token, protocol.Failed(stop.kind, stop.message, stop.log, stop.line))
    except Exception as error:  # this side's own failure: no candidate is judged by it
        message = f"the judge failed: {type(error).__name__}: {error}"[:600]
        _say(token, protocol.Failed("evaluator_error", message))
    finally:
        _close(sides)


def _standby(jobdir: Path, conditions: dict[str, Any]) -> dict[str, Any]:
    """The job known ahead of its candidate; its workers were started under `conditions`."""
    standby: dict[str, Any] = json.loads((jobdir / "standby.json").read_text())
    if any(standby.get(key) != value for key, value in conditions.items()):
        raise Stop("evaluator_error", "the job does not match the conditions the judge has")
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
        raise Stop("reference_error", message) from None


def _command(token: str, jobdir: Path) -> str:
    """The caller's next command, each `SIZE` before it answered on the way."""
    from htam_engine.evaluate.judging import sizes_on_meta

    while (command := sys.stdin.readline().strip()) == protocol.SIZE:
        _say(token, sizes_on_meta(jobdir / "reference.py"))
    return command


def _say(token: str, message: protocol.Message) -> None:
    print(json.dumps({**protocol.encode(message), "token": token}), flush=True)


def _cap_memory(job: dict[str, Any]) -> None:
    """The judge's own address space, capped as a CPU worker's is (on a GPU the CUDA
    driver maps far more than it uses: no cap there). Its memory depends on the problem
    only: every message of a worker is capped (`process.MAX_LINE`), and outputs are
    read in the layout the judge expects."""
    if job["device"] == "cpu":
        size = int(job["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
