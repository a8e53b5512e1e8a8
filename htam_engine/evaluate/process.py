"""A child process in its own process group that speaks JSON lines on stdout.

Each line read is stamped with the reader's own clock (`_t`), so a child cannot say when
it answered. A child started with a `token` gets it as its first stdin line and only its
lines carrying it count: another process writing into the pipe cannot forge them. What a
child may say is bounded: a line over `MAX_LINE` bytes, or more than `MAX_OUTPUT` in all,
ends the reading, and the next wait fails (`protocol.messages`): a worker that floods
its pipe cannot take the reader's memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from htam_engine.evaluate import reaper, sandbox
from htam_engine.machine import kill_process_group
from htam_engine.procs import descendants, stat_fields
from htam_engine.vocabulary import ErrorKind

EOF_EVENT = "__eof__"
FLOOD_EVENT = "__flood__"
MAX_LINE = 1 << 20  # the longest report a worker sends is a compiler log (~20 kB)
MAX_OUTPUT = 32 << 20  # all lines of one child together
_POLL_S = 0.05
_KINDS = frozenset(kind.value for kind in ErrorKind)


class Stop(Exception):
    """Evaluation ends early with an error of `kind`."""

    def __init__(
        self, kind: ErrorKind, message: str, log: str = "", line: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.log = log
        self.line = line


class Process(Protocol):
    """What `Child` uses of its process: `subprocess.Popen`'s, or a lent judge's."""

    pid: int
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log: Path,
        *,
        memory_mb: int | None = None,
        token: str | None = None,
        death_signal: int = signal.SIGKILL,
        listen: bool = True,
    ) -> None:
        """Start `argv`; with `listen` off its output is left unread in the pipe, for the
        process it is lent to (`keeper`)."""
        with log.open("ab") as stderr:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=sandbox.limits(memory_mb, death_signal),
            )
        self._attach(name, popen, log, token, reaped=sandbox.REAPER in argv)
        if token is not None:
            self.send(token)
        if listen:
            self.listen()

    @classmethod
    def adopt(cls, name: str, process: Process, log: Path, token: str) -> Child:
        """A child another process started and lent (`keeper.Lent`), its token sent."""
        child = cls.__new__(cls)
        child._attach(name, process, log, token, reaped=False)
        child.listen()
        return child

    def _attach(
        self, name: str, popen: Process, log: Path, token: str | None, reaped: bool
    ) -> None:
        self.name = name
        self.log = log
        self.token = token
        self.frozen: list[int] = []
        self.reaped = reaped  # its process is the command's reaper
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.popen: Process = popen

    def listen(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _lines(self) -> Iterator[bytes]:
        """The child's output lines; its pipe closed under the reader ends them as its
        end does (a lent judge's, given back: `keeper.Lent.close`)."""
        assert self.popen.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            while line := self.popen.stdout.readline(MAX_LINE + 1):
                yield line

    def _read(self) -> None:
        total = 0
        for line in self._lines():
            stamp = time.perf_counter()
            total += len(line)
            if len(line) > MAX_LINE or total > MAX_OUTPUT:
                what = f"a line over {MAX_LINE} bytes" if len(line) > MAX_LINE else "too much"
                self.events.put({"event": FLOOD_EVENT, "what": what, "_t": stamp})
                return  # nothing more is read: the wait that takes this event stops
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(event, dict):
                continue
            if self.token is not None and event.pop("token", None) != self.token:
                continue
            event["_t"] = stamp
            self.events.put(event)
        self.events.put({"event": EOF_EVENT, "_t": time.perf_counter()})

    def send(self, command: str) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(command.encode() + b"\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died; the next wait reports how

    def kill(self, reap: bool = True) -> None:
        """Kill the whole group and every descendant (compilers, forks that left the
        group), then reap the child (not in a signal handler: the code it interrupted
        may hold the lock `Popen.wait` takes, and would never give it back)."""
        pids = descendants(self.popen.pid)
        kill_process_group(self.popen.pid)
        signal_all(pids, signal.SIGKILL)
        if reap:
            self.popen.wait()

    def members(self) -> list[int]:
        """Every process of this child: what a sandboxed command made, wherever it went,
        below its reaper (trusted, and never stopped itself)."""
        below = reaper.tree(self.popen.pid)
        return below if self.reaped else [self.popen.pid, *below]

    def wait_for(
        self,
        wanted: str,
        limit_s: float,
        phase: str,
        cancel: threading.Event,
        on_other: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict:
        """The next `wanted` event; raises Stop on an error event, death, timeout or cancel.
        Other events go to `on_other` (dropped without it)."""
        deadline = time.monotonic() + limit_s
        while True:
            if cancel.is_set():
                raise Stop(ErrorKind.CANCELLED, f"cancelled during {phase}")
            if time.monotonic() > deadline:
                raise Stop(ErrorKind.TIMEOUT, f"{phase} exceeded its limit of {limit_s:g} s")
            try:
                event = self.events.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if event.get("event") == wanted:
                return event
            if event.get("event") == "error":
                raise self._reported(event)
            if event.get("event") == EOF_EVENT:
                raise self._death(phase)
            if event.get("event") == FLOOD_EVENT:
                raise self._flood(phase, str(event["what"]))
            if on_other is not None:
                on_other(event)

    def pending(self) -> list[dict[str, Any]]:
        """Events read but never asked for (the end of the output stays queued)."""
        found = []
        while not self.events.empty():
            found.append(self.events.get_nowait())
        for event in found:
            if event.get("event") == EOF_EVENT:
                self.events.put(event)
        return [event for event in found if event.get("event") != EOF_EVENT]

    def _reported(self, event: dict[str, Any]) -> Stop:
        """The `Stop` a child's error event reports. A kind outside `ErrorKind` is the
        sayer's fault: the judge's an evaluator error, the reference's its own failure,
        a candidate's a forged report."""
        message, log = str(event.get("message")), str(event.get("log") or "")
        line = event.get("line") if isinstance(event.get("line"), int) else None
        said = str(event.get("kind"))
        if said in _KINDS:
            return Stop(ErrorKind(said), message, log, line)
        if self.name == "judge":
            return Stop(ErrorKind.EVALUATOR_ERROR, f"the judge reported a {said!r} failure")
        if self.name == "reference":
            return Stop(ErrorKind.REFERENCE_ERROR, message, log, line)
        forged = f"protocol.messages: the {self.name} reported a {said!r} failure"
        return Stop(ErrorKind.CHEATING, forged[:300])

    def _flood(self, phase: str, what: str) -> Stop:
        if self.name == "judge":
            return Stop(ErrorKind.EVALUATOR_ERROR, f"the judge wrote {what} during {phase}")
        return Stop(
            ErrorKind.CHEATING, f"protocol.messages: the {self.name} wrote {what} during {phase}"
        )

    def _death(self, phase: str) -> Stop:
        code = self.popen.wait()
        if code > 128 and code - 128 in signal.valid_signals():
            code = 128 - code  # a sandbox reports its child's signal as 128 + signal
        tail = _tail(self.log, 1500)
        if self.name == "judge":  # trusted: its failure is no code's under evaluation
            last = tail.strip().splitlines()[-1:] or [f"exit status {code}"]
            return Stop(
                ErrorKind.EVALUATOR_ERROR, f"the judge failed during {phase}: {last[0]}", tail
            )
        if self.name == "reference":
            last = tail.strip().splitlines()[-1:] or ["no output"]
            return Stop(
                ErrorKind.REFERENCE_ERROR,
                f"the reference failed during {phase}: {last[0]}",
                tail,
            )
        if self.reaped and code == reaper.OVER_CAP:
            cap = sandbox.MAX_PROCESSES
            return Stop(
                ErrorKind.CRASH,
                f"the {self.name} made over {cap} processes (the cap) during {phase}",
            )
        if self.reaped and code == reaper.OVER_MEMORY:
            return Stop(
                ErrorKind.OOM,
                f"the {self.name}'s processes held more memory together than its cap "
                f"during {phase}",
            )
        if code < 0:
            name = signal.Signals(-code).name
            if -code == signal.SIGKILL:
                return Stop(
                    ErrorKind.OOM, f"the {self.name} was killed during {phase} (out of memory?)"
                )
            return Stop(ErrorKind.CRASH, f"the {self.name} died of {name} during {phase}", tail)
        if "MemoryError" in tail or "out of memory" in tail:
            return Stop(ErrorKind.OOM, f"the {self.name} ran out of memory during {phase}", tail)
        return Stop(
            ErrorKind.CRASH, f"the {self.name} exited with code {code} during {phase}", tail
        )


def _tail(path: Path, size: int) -> str:
    """The end of a log a sandboxed worker could have replaced: never through a link
    (it could point at a file only this side may read, and the tail reaches the user
    and the next prompt)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return ""
        handle.seek(max(0, os.fstat(descriptor).st_size - size))
        return handle.read(size).decode(errors="replace")


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _running(pid: int) -> bool:
    try:
        state = stat_fields(f"/proc/{pid}/stat")[0]
    except OSError:
        return False
    return state not in ("T", "t", "Z", "X")


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


def pin(child: Child, core: int) -> None:
    """Run every thread of `child` on `core` only (threads started later inherit it)."""
    for pid in child.members():
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), {core})


def quietest_core(sample_s: float = 0.1) -> int:
    """The core this process may use that was busy least over `sample_s` (/proc/stat)."""
    allowed = sorted(os.sched_getaffinity(0))
    before = _busy_ticks()
    time.sleep(sample_s)
    after = _busy_ticks()
    return min(allowed, key=lambda core: after.get(core, 0) - before.get(core, 0))


def _busy_ticks() -> dict[int, int]:
    """Non-idle jiffies per core."""
    ticks = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            numbers = [int(v) for v in values]
            ticks[int(name[3:])] = sum(numbers) - numbers[3] - numbers[4]  # minus idle, iowait
    return ticks


def freeze(child: Child) -> None:
    """Stop every process of `child` (repeated until no new one appears and all are
    stopped), so nothing it started runs while the other side is timed or its output
    is read."""
    stopped: set[int] = set()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        members = child.members()
        new = [pid for pid in members if pid not in stopped]
        signal_all(new, signal.SIGSTOP)
        stopped.update(new)
        if not new and not any(_running(pid) for pid in members):
            break
    child.frozen = sorted(stopped)


def thaw(child: Child) -> None:
    """Let the processes `freeze` stopped go on (none can have started since)."""
    signal_all(child.frozen or child.members(), signal.SIGCONT)
    child.frozen = []
