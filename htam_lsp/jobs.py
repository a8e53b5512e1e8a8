"""Background jobs: one `htam optimize --events` subprocess per job, in its own group.

The server's event loop only awaits pipes; the loop, compiles and timings all run in
the subprocess, and cancelling a job kills the whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LINE_LIMIT = 32 * 1024 * 1024  # a step event carries the whole candidate source
NICENESS = 19  # batch work: the editor wins any contention; idle CPUs still go to the job
TERMINAL = ("done", "failed", "cancelled", "refused")
_ids = itertools.count(1)


@dataclass
class Job:
    """One run of `htam optimize` for one kernel, as the editor sees it."""

    uri: str
    kernel: str
    steps: int
    id: str = field(default_factory=lambda: f"htam-{os.getpid()}-{next(_ids)}")
    state: str = "queued"
    step: int = 0
    phase: str = ""
    message: str = ""
    best_speedup: float | None = None
    pid: int | None = None
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def token(self) -> str:
        """The work-done progress token of this job."""
        return f"{self.id}-progress"

    def payload(self) -> dict[str, Any]:
        """The `htam/jobState` notification body (docs/ARCHITECTURE.md)."""
        return {
            "jobId": self.id,
            "uri": self.uri,
            "kernel": self.kernel,
            "state": self.state,
            "step": self.step,
            "steps": self.steps,
            "phase": self.phase,
            "message": self.message,
            "bestSpeedup": self.best_speedup,
            "pid": self.pid,
        }


OnEvent = Callable[[Job, dict[str, Any]], Awaitable[None] | None]


def optimize_argv(
    task: str, start: str, steps: int, settings: Any, seed: int, output: str
) -> list[str]:
    """The documented `htam optimize` command line for one job, at a lower CPU priority
    (`nice`) so that compiles and timings do not slow the editor down."""
    nice = shutil.which("nice")
    argv = [nice, "-n", str(NICENESS)] if nice else []
    argv += [sys.executable, "-m", "htam_engine.cli", "optimize", task, "--start", start]
    argv += ["--steps", str(steps), "--provider", settings.provider]
    for flag, value in (
        ("--model", settings.model),
        ("--base-url", settings.base_url),
        ("--cassette", settings.cassette),
    ):
        if value:
            argv += [flag, value]
    argv += ["--device", settings.device, "--seed", str(seed), "--output", output, "--events"]
    return argv


async def run_process(job: Job, argv: Sequence[str], on_event: OnEvent) -> tuple[int, str]:
    """Run `argv` for `job`, feeding each JSON line to `on_event`; (exit code, stderr tail)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        limit=LINE_LIMIT,
    )
    job.pid = proc.pid
    tail: deque[str] = deque(maxlen=20)
    assert proc.stdout is not None and proc.stderr is not None
    drain = asyncio.create_task(_drain(proc.stderr, tail))
    try:
        async for raw in proc.stdout:
            event = _event(raw)
            if event is not None:
                result = on_event(job, event)
                if asyncio.iscoroutine(result):
                    await result
        code = await proc.wait()
    finally:
        kill_group(job)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(drain, 2)
    return code, "\n".join(tail)


def kill_group(job: Job) -> bool:
    """Kill the job's process group and the groups of all its descendants.

    The evaluator runs each candidate in a worker with its own session, which a kill
    of the job's group alone would leave running. False when the job had already gone.
    """
    if job.pid is None:
        return False
    groups = {job.pid}
    for pid in descendants(job.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(pid))
    killed = False
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
            killed = True
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def descendants(root: int) -> list[int]:
    """Every live descendant of `root`, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _event(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except ValueError:
        log.info("worker: %s", raw[:200].decode("utf-8", "replace").rstrip())
        return None
    return event if isinstance(event, dict) and "event" in event else None


async def _drain(stream: asyncio.StreamReader, tail: deque[str]) -> None:
    async for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            tail.append(line)
            log.info("worker stderr: %s", line[:500])
