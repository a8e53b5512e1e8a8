"""One of the judge's two sandboxed workers as the judge sees it (`Side`): started by
`judge.main` before the judge imports torch, driven by `judging.Judge`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from htam_engine.evaluate import accounting, sandbox
from htam_engine.evaluate.jobspec import Conditions
from htam_engine.evaluate.process import Child, Stop, python_module
from htam_engine.procs import ancestors
from htam_engine.vocabulary import ErrorKind


class Side:
    """One sandboxed worker, its box and this process's view of the box's buffers."""

    def __init__(self, role: str, jobdir: Path, conditions: Conditions) -> None:
        """Start the worker under `conditions` (device, threads, memory and backend: it
        waits for the job, and imports nothing of it until `load`)."""
        self.role = role
        self.box = jobdir / role
        argv = python_module("htam_engine.evaluate.worker", str(self.box), role)
        memory = conditions.memory_mb if conditions.device == "cpu" else None
        self.child = Child(
            role,
            sandbox.command(argv, self.box, conditions.device),
            self.box,
            _environment(self.box, conditions),
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
            raise Stop(ErrorKind.CHEATING, f"process.tracking: the {self.role} killed its reaper")


def _environment(box: Path, conditions: Conditions) -> dict[str, str]:
    env = sandbox.environment(box, conditions.threads)
    if conditions.backend == "triton":
        from htam_engine import triton_backend  # tree-sitter: not before other workers start

        env.update(triton_backend.environment(conditions.device, box))
    return env


def _buffer(path: Path, size: int) -> int:
    """A fresh buffer file at `path`, created before any worker can touch it; this
    process reads and writes it through the descriptor (never a shared mapping)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.ftruncate(descriptor, size)
    return descriptor
