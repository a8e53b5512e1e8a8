"""Background jobs: one `htam optimize --events` subprocess per job, in its own group.

The server's event loop only awaits pipes; the loop, compiles and timings all run in the
subprocess. While no job runs, one such process waits ready for the kernel the user has
open (`Warm`, `htam_engine.warm`: the engine imported, its first judge and workers
started), and the next job on that kernel takes it instead of starting cold.
`JobManager` owns every job and the one way to stop one: SIGTERM to the job's process
group (the engine then stops its worker and keeps what it learned), SIGKILL to
the group and to every descendant's group after a grace period. How a job ended comes
from the engine's own last event (`Result` or `Failed`), not from its exit code.
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
from typing import Any

from htam_engine import events
from htam_engine.evaluate.verdict import Verdict
from htam_engine.machine import kill_process_group
from htam_engine.procs import descendants
from htam_engine.vocabulary import TERMINAL_JOB_STATES, JobState

log = logging.getLogger(__name__)

LINE_LIMIT = 32 * 1024 * 1024  # a step event carries the whole candidate source
NICENESS = 19  # batch work: the editor wins any contention; idle CPUs still go to the job
GRACE_S = 5.0  # between SIGTERM and SIGKILL
TERMINAL = TERMINAL_JOB_STATES
_ids = itertools.count(1)


@dataclass
class Job:
    """One run of `htam optimize` for one kernel, as the editor sees it."""

    uri: str
    kernel: str  # what the user calls it: their kernel function, else the file
    steps: int
    unit: str = ""  # the unit that names the file's task (where its lens shows the job)
    id: str = field(default_factory=lambda: f"htam-{os.getpid()}-{next(_ids)}")
    state: JobState = "queued"
    step: int = 0
    phase: str = ""
    message: str = ""
    best_speedup: float | None = None  # of the best apply action offered when it ended
    ref_speedup: float | None = None
    suggestions: int = 0  # apply actions offered for the kernel when the job ended
    pid: int | None = None
    cancel_requested: bool = False
    steps_done: int = 0
    last: events.Result | events.Failed | None = None  # the engine's own ending
    records: dict[int, int] = field(default_factory=dict)  # engine step -> its record's number
    excluded: tuple[str, ...] = ()  # strategies that did not help on this code in earlier jobs
    task: asyncio.Task[None] | None = None

    @property
    def token(self) -> str:
        """The work-done progress token of this job."""
        return f"{self.id}-progress"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

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
            "refSpeedup": self.ref_speedup,
            "suggestions": self.suggestions,
            "pid": self.pid,
        }


OnEvent = Callable[[Job, events.Event], Awaitable[None] | None]
OnLine = Callable[[Job, bytes], Awaitable[None] | None]


def eval_argv(task: str, candidate: str, device: str) -> list[str]:
    """`htam eval TASK CANDIDATE --device DEVICE --json` (on `cuda` where no GPU runs a
    CUDA candidate, the evaluator still compiles it with nvcc and says how that went)."""
    argv = [sys.executable, "-m", engine_module(), "eval", task, candidate]
    return [*argv, "--device", device, "--json"]


def printed_verdict(out: bytes) -> Verdict | None:
    """The verdict `htam eval --json` printed, or None where it printed none."""
    try:
        data = json.loads(out)
        return Verdict.from_json(data) if isinstance(data, dict) else None
    except (ValueError, TypeError, KeyError):
        return None


def warm_argv(task: str, device: str) -> list[str]:
    """An `htam optimize` started ahead for `task` on `device` (at the jobs' priority)."""
    nice = shutil.which("nice")
    argv = [nice, "-n", str(NICENESS)] if nice else []
    return [*argv, sys.executable, "-m", WARM_MODULE, task, device]


ENGINE = "htam_engine.cli"
WARM_MODULE = "htam_engine.warm"


@dataclass
class Warm:
    """A process started ahead for one task and device, waiting for its job's arguments."""

    task: str
    device: str
    proc: asyncio.subprocess.Process

    def fits(self, task: str, device: str) -> bool:
        return (self.task, self.device) == (task, device) and self.proc.returncode is None


def engine_module() -> str:
    """The module run as `htam` (`HTAM_LSP_ENGINE`: a stand-in engine, for tests)."""
    return os.environ.get("HTAM_LSP_ENGINE") or ENGINE


def optimize_argv(
    task: str,
    start: str,
    steps: int,
    settings: Any,
    seed: int,
    output: str,
    exclude: Sequence[str] = (),
) -> list[str]:
    """The documented `htam optimize` command line for one job, at a lower CPU priority
    (`nice`) so that compiles and timings do not slow the editor down; `exclude`: the
    strategies that did not help on this code in earlier jobs (never retried)."""
    nice = shutil.which("nice")
    argv = [nice, "-n", str(NICENESS)] if nice else []
    argv += [sys.executable, "-m", engine_module(), "optimize", task, "--start", start]
    argv += ["--steps", str(steps), "--provider", settings.provider]
    for flag, value in (
        ("--model", settings.model),
        ("--base-url", settings.base_url),
        ("--cassette", settings.cassette),
    ):
        if value:
            argv += [flag, value]
    if exclude:
        argv += ["--exclude", ",".join(exclude)]
    argv += ["--device", settings.device, "--seed", str(seed), "--output", output, "--events"]
    return argv


class JobManager:
    """Every job of this server: create, run, stop; one cancellation protocol."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.jobs: dict[str, Job] = {}
        self.grace_s = grace_s
        self.warm: Warm | None = None
        self._warming = asyncio.Lock()  # one process started ahead at a time

    def running(self) -> bool:
        return any(not job.finished for job in self.jobs.values())

    async def warm_up(self, task: str, device: str) -> None:
        """Have a process ready for the next job on `task` (none while a job runs: its
        start would slow a timing; none for a stand-in engine)."""
        async with self._warming:
            if self.running() or engine_module() != ENGINE:
                return
            if self.warm is not None and self.warm.fits(task, device):
                return
            await self.cool()
            proc = await asyncio.create_subprocess_exec(
                *warm_argv(task, device),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=LINE_LIMIT,
            )
            self.warm = Warm(task, device, proc)
            if self.running():  # a job began meanwhile (cold): nothing starts beside it
                await self.cool()

    async def cool(self, task: str | None = None) -> None:
        """End the process started ahead (only if it is for `task`, when given): end of
        input lets it finish its spare; killed if it has not gone after the grace period."""
        warm = self.warm
        if warm is None or task not in (None, warm.task):
            return
        self.warm = None
        assert warm.proc.stdin is not None
        warm.proc.stdin.close()
        try:
            await asyncio.wait_for(warm.proc.wait(), self.grace_s)
        except TimeoutError:
            kill_group(warm.proc.pid)
            await warm.proc.wait()

    async def _take_warm(self, task: str | None, device: str) -> asyncio.subprocess.Process | None:
        """The process started ahead if it fits the job; else it is ended."""
        warm = self.warm
        if warm is not None and task is not None and warm.fits(task, device):
            self.warm = None
            return warm.proc
        await self.cool()
        return None

    def create(self, uri: str, kernel: str, steps: int, unit: str = "") -> Job:
        job = Job(uri, kernel, steps, unit or kernel)
        self.jobs[job.id] = job
        return job

    def active(self, uri: str) -> Job | None:
        return next((j for j in self.jobs.values() if j.uri == uri and not j.finished), None)

    def by_token(self, token: Any) -> Job | None:
        return next((j for j in self.jobs.values() if j.token == token), None)

    def cancel(self, job_id: str | None = None) -> list[Job]:
        """Stop the running jobs (all of them, or the one with `job_id`)."""
        chosen = [j for j in self.jobs.values() if not j.finished and job_id in (None, j.id)]
        for job in chosen:
            self.stop(job)
        return chosen

    def stop(self, job: Job) -> None:
        """SIGTERM now, SIGKILL to everything that is left after the grace period."""
        job.cancel_requested = True
        if signal_group(job, signal.SIGTERM):
            with contextlib.suppress(RuntimeError):  # no running loop: shutting down
                asyncio.get_running_loop().call_later(self.grace_s, kill_group, job)

    async def run(
        self,
        job: Job,
        argv: Sequence[str],
        on_event: OnEvent,
        task: str | None = None,
        device: str = "auto",
    ) -> None:
        """Run the job's process to its end and set its final state and message; the
        process started ahead for (`task`, `device`) serves it when there is one."""
        if job.cancel_requested:
            code, tail = -signal.SIGTERM, ""
        else:
            job.state = "running"
            ready = await self._take_warm(task, device)
            code, tail = await run_process(job, argv, _typed(_recording(on_event)), ready)
        job.state, job.message = ending(job, code, tail)

    async def output(self, job: Job, argv: Sequence[str]) -> tuple[int, bytes, str]:
        """Run a command with one answer on stdout (`htam eval --json`) as `job`, under the
        same stop protocol: (exit code, stdout, stderr tail)."""
        if job.cancel_requested:
            return -signal.SIGTERM, b"", ""
        job.state = "running"
        chunks: list[bytes] = []
        code, tail = await run_process(job, argv, lambda _job, raw: chunks.append(raw))
        return code, b"".join(chunks), tail


def _typed(on_event: OnEvent) -> OnLine:
    """A line handler that feeds each typed event of the stream to `on_event`."""

    def line(job: Job, raw: bytes) -> Awaitable[None] | None:
        event = _event(raw)
        return on_event(job, event) if event is not None else None

    return line


def _recording(on_event: OnEvent) -> OnEvent:
    """`on_event`, after keeping the facts the job's ending is decided by."""

    def record(job: Job, event: events.Event) -> Awaitable[None] | None:
        if isinstance(event, events.Result | events.Failed):
            job.last = event
        elif isinstance(event, events.Step):
            job.steps_done += 1
        return on_event(job, event)

    return record


def ending(job: Job, code: int, tail: str) -> tuple[JobState, str]:
    """(state, message) of a job whose process ended with `code`: the engine's own word
    (its `Failed` or `Result` event) first, the exit code and stderr only without one."""
    last = job.last
    if job.cancel_requested:
        kept = f"; {job.steps_done} finished step(s) kept" if job.steps_done else ""
        return "cancelled", f"the worker was stopped{kept}"
    if isinstance(last, events.Failed):
        return "failed", last.message
    if isinstance(last, events.Result):
        if last.stopped != "completed" and job.steps_done == 0:
            return "failed", last.stopped
        return "done", job.message
    lines = tail.strip().splitlines()
    why = lines[-1] if lines else "no output"
    return "failed", f"htam optimize ended without a result (exit code {code}): {why}"


async def run_process(
    job: Job,
    argv: Sequence[str],
    on_line: OnLine,
    ready: asyncio.subprocess.Process | None = None,
) -> tuple[int, str]:
    """Run `argv` for `job` (in `ready`, a process started ahead, when given), feeding each
    stdout line to `on_line`; (exit code, stderr tail)."""
    if ready is not None:
        assert ready.stdin is not None
        module = argv.index(engine_module())
        ready.stdin.write(json.dumps(list(argv[module + 1 :])).encode() + b"\n")
        ready.stdin.close()
        proc = ready
    else:
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
            result = on_line(job, raw)
            if asyncio.iscoroutine(result):
                await result
        code = await proc.wait()
    finally:
        kill_group(job)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(drain, 2)
    return code, "\n".join(tail)


def signal_group(job: Job, sig: int) -> bool:
    """Send `sig` to the job's process group; False when it had already gone."""
    if job.pid is None:
        return False
    return kill_process_group(job.pid, sig)


def kill_group(job: Job | int) -> bool:
    """SIGKILL the process group of the job (or of a pid) and the groups of all its
    descendants.

    The evaluator runs each candidate in a worker with its own session, which a kill
    of the job's group alone would leave running. False when the job had already gone.
    """
    pid = job if isinstance(job, int) else job.pid
    if pid is None:
        return False
    groups = {pid}
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(child))
    killed = [kill_process_group(group) for group in groups]
    return any(killed)


def _event(raw: bytes) -> events.Event | None:
    """The typed event of one stdout line; anything else is logged and skipped."""
    try:
        return events.parse_line(raw)
    except events.EventError as error:
        log.info("worker: %s (%s)", raw[:200].decode("utf-8", "replace").rstrip(), error)
        return None


async def _drain(stream: asyncio.StreamReader, tail: deque[str]) -> None:
    async for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            tail.append(line)
            log.info("worker stderr: %s", line[:500])
