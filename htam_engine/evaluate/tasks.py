"""What a worker's tasks did during one call, read by the judge from /proc.

The thread and core policy is enforced from outside the worker: before and after each
call the judge reads every task's demand (schedstat: the time it ran plus the time it
was ready to run but queued for a core) and, after it, every task's CPU affinity. A task
counts as running when its demand was more than `RUNNING_SHARE` of the call's wall time:
a thread that slept does not; a spinning helper does, even in a call too short for the
scheduler to hand it the pinned core. Under load a thread of the harness woken during a
call queues behind the neighbours and looks the same for that call: the judge tells the
two apart by how often it happens (`over_policy`). A candidate that starts more threads
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from htam_engine.procs import stat_fields

RUNNING_SHARE = 0.05
RUNNING_FLOOR_NS = 500_000
MOST_CALLS = 0.5  # over the policy in more than this share of the calls: a task of its own
TOLERATED_SHARE = 0.1  # of a timing's calls, whose task counts `threads_seen` leaves out
SETTLE_S = 0.002  # the longest a call waits for the worker's other tasks to sleep again


_CPUCLOCK_SCHED = 2  # a process's CPU clock id: ((~pid) << 3) | CPUCLOCK_SCHED
PARALLEL_SLACK = 1.2  # CPU time over wall time that one core cannot give


class Books(NamedTuple):
    """One task's schedstat (ns it ran, ns it was ready to run but queued) and affinity."""

    ran_ns: int
    queued_ns: int
    cores: frozenset[int]

    @property
    def demand_ns(self) -> int:
        return self.ran_ns + self.queued_ns


_NONE = Books(0, 0, frozenset())


@dataclass(frozen=True)
class Snapshot:
    """Each live task's books, and the processes' CPU clocks (which keep the time of
    threads that ended), read within `span`."""

    tasks: dict[int, Books]
    processes: dict[int, int]
    owners: dict[int, int]  # task -> its process
    span: tuple[float, float] = (0.0, 0.0)  # perf_counter before and after the clocks


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
    tasks: dict[int, Books] = {}
    processes: dict[int, int] = {}
    owners: dict[int, int] = {}
    started = time.perf_counter()
    for pid in pids:
        with contextlib.suppress(OSError):
            processes[pid] = time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED)
    span = (started, time.perf_counter())
    for pid in processes:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    ran, queued, _ = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()
                    cores = frozenset(os.sched_getaffinity(int(task)))
                    tasks[int(task)] = Books(int(ran), int(queued), cores)
                    owners[int(task)] = pid
    return Snapshot(tasks, processes, owners, span)


def settled(before: Snapshot, pids: list[int], main: int | None) -> Snapshot:
    """`before` (read while `pids` were stopped), its tasks' demand read again once every
    task but `main` (the thread a call runs on) is asleep again, or `SETTLE_S` passed:
    continuing a stopped process wakes each of its tasks, and one woken on the pinned
    core would queue behind the call's own thread, its demand ours, not the candidate's.
    A spinning helper never settles. The process clocks stay `before`'s: a running
    thread's pending time reaches its process's clock later, as if run beside the call."""
    deadline = time.monotonic() + SETTLE_S
    while _runnable(pids, main) and time.monotonic() < deadline:
        time.sleep(0.0001)
    now = snapshot(pids)
    return replace(before, tasks=now.tasks, owners=now.owners)


def _runnable(pids: list[int], main: int | None) -> bool:
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                if int(task) != main and _state(pid, task) == "R":
                    return True
    return False


def _state(pid: int, task: str) -> str:
    try:
        return stat_fields(f"/proc/{pid}/task/{task}/stat")[0]
    except OSError:
        return "?"


def observe(
    before: Snapshot,
    after: Snapshot,
    core: int | None,
    wall_s: float,
    sandbox: frozenset[int] = frozenset(),
) -> Observed:
    """What ran, or was ready to, between `before` and `after` (a task new since `before`
    started at 0); `core` is the one the worker is pinned to (None: not pinned); the
    tasks of the `sandbox` processes are not counted as running."""
    floor = max(RUNNING_FLOOR_NS, RUNNING_SHARE * wall_s * 1e9)
    names = []
    for task, books in after.tasks.items():
        if after.owners.get(task) in sandbox:
            continue
        earlier = before.tasks.get(task, _NONE)
        if books.demand_ns - earlier.demand_ns > floor:
            ran, queued = books.ran_ns - earlier.ran_ns, books.queued_ns - earlier.queued_ns
            names.append(f"{_name(task)} ran {ran / 1e6:.1f} ms, queued {queued / 1e6:.1f} ms")
    masks = [books.cores for books in after.tasks.values()]
    cores = sorted(set().union(*masks)) if core is not None and masks else []
    widened = core is not None and any(mask != {core} for mask in masks)
    used = sum(cpu - before.processes.get(pid, 0) for pid, cpu in after.processes.items())
    between_s = max(wall_s, after.span[1] - before.span[0])  # the clocks' own window
    parallel = used > PARALLEL_SLACK * between_s * 1e9 + 2 * RUNNING_FLOOR_NS
    return Observed(len(names), names, cores, widened, parallel)


def over_policy(counts: list[int], allowed: int) -> tuple[list[int], bool]:
    """The calls (indices) in which more tasks ran than `allowed`, and whether that is
    most of them: a task of the candidate's own that speeds the number up must work in
    most calls (the speedup is a median of pairs), and a spinning one is seen in every
    call; a thread of the harness held up by the load, or a sleeper a hypervisor charged
    stolen time to, is seen now and then."""
    over = [index for index, count in enumerate(counts) if count > allowed]
    return over, len(over) > MOST_CALLS * len(counts)


def threads_seen(counts: list[int]) -> int:
    """The tasks that ran in the busiest call past the busiest tenth of a timing's calls.

    A sleeper whose timer fires during a call (a daemon's tick) queues behind the call's
    thread, and the hypervisor can charge it time stolen from the core while it held it
    (1.6 ms once, under CI's load); a helper that speeds the number up must work in most
    calls (the speedup is a median of pairs), while a spinning one is seen in every call:
    a count seen only in the busiest tenth is not the policy's business.
    """
    ranked = sorted(counts, reverse=True)
    return ranked[int(len(ranked) * TOLERATED_SHARE)] if ranked else 0


def _name(task: int) -> str:
    try:
        return Path(f"/proc/{task}/comm").read_text().strip()[:16] or str(task)
    except OSError:
        return str(task)
