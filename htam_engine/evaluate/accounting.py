"""Time that other processes took from a worker during one call, from the kernel's books.

On a shared CPU a call's wall time includes the slices the scheduler gave to neighbours,
and how many depends on the call's length and the moment (short and long bursts are not
slowed alike), so two sides timed by wall clock next to a busy process disagree run to
run. The kernel counts, per thread, the time it waited runnable for a CPU (schedstat's
`run_delay`); that time, minus what the worker's own other threads and processes ran
meanwhile, is time neighbours held the CPU. The judge subtracts it from the wall time.

It is read by the trusted judge from /proc, never reported by the worker. It can only
take off time others ran: every thread of the worker's tree is charged through the
process CPU clocks (which keep the time of threads that already exited), and a call
during which any process or thread was created anywhere on the machine, or one of the
tree ended, is charged its whole wall time, since a task that came and went between two
reads is on no book the judge can see.

The books also count the worker's page faults: a call that faulted in fresh memory
(a process's first large allocations) is still warming up (`judging.Judge._warming`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from htam_engine import procs

_CPUCLOCK_SCHED = 2  # a process's CPU clock id: ((~pid) << 3) | CPUCLOCK_SCHED
_MINFLT = 7  # minflt in `procs.stat_fields` (field 10 of proc(5)'s stat)


@dataclass(frozen=True)
class Books:
    """The kernel's accounting of a worker's tree at one moment (the tree stopped)."""

    main_cpu_ns: int  # on-CPU time of the worker's main thread
    main_wait_ns: int  # time it waited runnable for a CPU
    tree_cpu_ns: int  # on-CPU time of every process of the tree, exited threads included
    members: frozenset[int]
    last_pid: int  # the newest process or thread id on the machine
    main_faults: int  # minor page faults of the worker's main process, all its threads


def main_process(members: list[int]) -> int | None:
    """The worker itself: the first process of the tree that is not the sandbox's."""
    for pid in sorted(members):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                return pid
        except OSError:
            continue
    return None


def read(main: int, members: list[int]) -> Books | None:
    """The books now, or None when any of them cannot be read (then nothing is subtracted)."""
    try:
        cpu, wait = (
            int(v) for v in Path(f"/proc/{main}/task/{main}/schedstat").read_text().split()[:2]
        )
        tree = sum(time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED) for pid in members)
        last_pid = int(Path("/proc/loadavg").read_text().split()[-1])
        faults = int(procs.stat_fields(f"/proc/{main}/stat")[_MINFLT])
    except (OSError, ValueError, IndexError):
        return None
    return Books(cpu, wait, tree, frozenset(members), last_pid, faults)


def stolen_ms(before: Books | None, after: Books | None, wall_ms: float) -> float | None:
    """Milliseconds neighbours held the CPU while the main thread waited for it during a
    call of `wall_ms`; None when the books cannot say (then the call is charged its whole
    wall time).

    At most the part of the wall time the worker's own tree did not run: the books are
    read around the call, not at its ends, so a wait they count just outside it (queued
    behind a neighbour on waking before `go`) could otherwise take off more than the
    neighbours held during it; no call is charged less than the CPU time it ran."""
    if before is None or after is None:
        return None
    if before.members != after.members or before.last_pid != after.last_pid:
        return None
    own_ns = after.tree_cpu_ns - before.tree_cpu_ns
    own_others = own_ns - (after.main_cpu_ns - before.main_cpu_ns)
    waited_ms = max(0, after.main_wait_ns - before.main_wait_ns - own_others) / 1e6
    return min(waited_ms, max(0.0, wall_ms - own_ns / 1e6))


def faults(before: Books | None, after: Books | None) -> int:
    """Minor page faults of the worker's main process between two readings (0 unknown)."""
    return after.main_faults - before.main_faults if before and after else 0
