"""What a worker's tasks did during one call, read by the judge from /proc.

The thread and core policy is enforced from outside the worker: before and after each
call the judge reads every task's CPU time (schedstat) and, after it, every task's CPU
affinity. A task counts as running when it took more than `RUNNING_SHARE` of the call's
wall time (a thread that only waited does not); a candidate that starts more threads
than the policy allows, or widens its affinity past the core it was pinned to, cannot
hide it from these books, whatever it says about itself. The sandbox's own processes
above the worker (bwrap, woken when the worker is stopped and continued around a call)
are not counted as running: on the one pinned core they add no speed, and their
affinity and CPU time still count for `widened` and `parallel`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

RUNNING_SHARE = 0.05
RUNNING_FLOOR_NS = 500_000


_CPUCLOCK_SCHED = 2  # a process's CPU clock id: ((~pid) << 3) | CPUCLOCK_SCHED
PARALLEL_SLACK = 1.2  # CPU time over wall time that one core cannot give


@dataclass(frozen=True)
class Snapshot:
    """Each live task's CPU time (ns) and affinity, and the processes' CPU clocks (which
    keep the time of threads that ended)."""

    tasks: dict[int, tuple[int, frozenset[int]]]
    processes: dict[int, int]
    owners: dict[int, int]  # task -> its process


@dataclass(frozen=True)
class Observed:
    """Tasks that ran during a call, the cores they may run on (pinned calls only),
    whether that is more than the core they were pinned to, and whether the tree ran on
    more than one core at once."""

    running: int
    names: list[str]  # what ran: name and CPU milliseconds
    cores: list[int]
    widened: bool
    parallel: bool


def snapshot(pids: list[int]) -> Snapshot:
    tasks: dict[int, tuple[int, frozenset[int]]] = {}
    processes: dict[int, int] = {}
    owners: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            processes[pid] = time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED)
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    cpu = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
                    tasks[int(task)] = (cpu, frozenset(os.sched_getaffinity(int(task))))
                    owners[int(task)] = pid
    return Snapshot(tasks, processes, owners)


def observe(
    before: Snapshot,
    after: Snapshot,
    core: int | None,
    wall_s: float,
    sandbox: frozenset[int] = frozenset(),
) -> Observed:
    """What ran between `before` and `after` (a task new since `before` started at 0);
    `core` is the one the worker is pinned to (None: not pinned); the tasks of the
    `sandbox` processes are not counted as running."""
    floor = max(RUNNING_FLOOR_NS, RUNNING_SHARE * wall_s * 1e9)
    ran = {
        task: cpu - before.tasks.get(task, (0, frozenset()))[0]
        for task, (cpu, _) in after.tasks.items()
        if after.owners.get(task) not in sandbox
    }
    names = [f"{_name(task)} {ns / 1e6:.1f} ms" for task, ns in ran.items() if ns > floor]
    masks = [mask for _, mask in after.tasks.values()]
    cores = sorted(set().union(*masks)) if core is not None and masks else []
    widened = core is not None and any(mask != {core} for mask in masks)
    used = sum(cpu - before.processes.get(pid, 0) for pid, cpu in after.processes.items())
    parallel = used > PARALLEL_SLACK * wall_s * 1e9 + 2 * RUNNING_FLOOR_NS
    return Observed(len(names), names, cores, widened, parallel)


def _name(task: int) -> str:
    try:
        return Path(f"/proc/{task}/comm").read_text().strip()[:16] or str(task)
    except OSError:
        return str(task)
