"""The trusted parent of every sandboxed command:
`python -I -S reaper.py CAP RESIDENT_MB -- ARGV...`.

It makes itself a child subreaper, so a process of the command's tree that forks twice
and lets its parent die comes back to it instead of to init: every task the command
creates stays below this process, where the judge stops, charges and kills it (with or
without bubblewrap). It runs ARGV, reaps every orphan, kills the whole tree when the
tree holds more than CAP processes (a fork bomb; root ignores RLIMIT_NPROC), more than
RESIDENT_MB of memory together (0: no cap; a compiler reading `/dev/zero` grows its
address space to any per-process cap, and each process of a tree may have its own), or
when it is told to stop (SIGTERM: its caller died, see `sandbox.limits`), and exits with
the command's status (128 + signal for a signal, 125 for the process cap, 123 for the
memory cap).

Dependency-free and run without site (`-I -S`): it starts in milliseconds, and nothing
the candidate could place on a path is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
NAME = b"htam-reaper"
OVER_CAP = 125
OVER_MEMORY = 123
_PAGE = os.sysconf("SC_PAGE_SIZE")
_POLL_S = 0.02


def tree(root: int) -> list[int]:
    """Every live process below `root`, read from the kernel's children lists."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def resident_mb(pids: list[int]) -> float:
    """The memory `pids` hold together (resident pages; a page two share counts twice)."""
    pages = 0
    for pid in pids:
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/statm") as handle,
        ):
            pages += int(handle.read().split()[1])
    return pages * _PAGE / (1 << 20)


def _kill_tree(limit_s: float = 5.0) -> None:
    """Kill every process below this one, again until none is left (a process that
    forked while the others were killed included), reaping them."""
    deadline = time.monotonic() + limit_s
    while (pids := tree(os.getpid())) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.005)


def main(argv: list[str]) -> int:
    cap, resident_cap = int(argv[0]), int(argv[1])
    command = argv[argv.index("--") + 1 :]
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(NAME))

    def stop(signum: int, _frame: object) -> None:
        _kill_tree()
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    child = os.fork()
    if child == 0:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    status: int | None = None
    while status is None:
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                status = os.waitstatus_to_exitcode(code)
        if status is None:
            members = tree(os.getpid())
            if len(members) > cap:
                _kill_tree()
                return OVER_CAP
            if resident_cap and resident_mb(members) > resident_cap:
                _kill_tree()
                return OVER_MEMORY
            time.sleep(_POLL_S)
    _kill_tree()  # what the command left behind does not outlive it
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
