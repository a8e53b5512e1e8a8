"""A child process in its own process group that speaks JSON lines on stdout."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EOF_EVENT = "__eof__"
_POLL_S = 0.05


class Stop(Exception):
    """Evaluation ends early with an error of `kind`."""

    def __init__(self, kind: str, message: str, log: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.log = log
        self.line = line


def _memory_cap(megabytes: int) -> Callable[[], None]:
    def apply() -> None:
        size = megabytes << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return apply


class Child:
    def __init__(
        self, module: str, jobdir: Path, env: dict[str, str], log: Path, memory_mb: int | None
    ) -> None:
        self.name = module.rsplit(".", 1)[-1]
        self.log = log
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        with log.open("ab") as stderr:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", module, str(jobdir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=jobdir,
                start_new_session=True,
                text=True,
                preexec_fn=_memory_cap(memory_mb) if memory_mb else None,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self.events.put(event)
        self.events.put({"event": EOF_EVENT})

    def send(self, command: str) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(command + "\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died; the next wait reports how

    def kill(self) -> None:
        """Kill the whole group (compilers the child started included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def wait_for(self, wanted: str, limit_s: float, phase: str, cancel: threading.Event) -> dict:
        """The next `wanted` event; raises Stop on an error event, death, timeout or cancel."""
        deadline = time.monotonic() + limit_s
        while True:
            if cancel.is_set():
                raise Stop("cancelled", f"cancelled during {phase}")
            if time.monotonic() > deadline:
                raise Stop("timeout", f"{phase} exceeded its limit of {limit_s:g} s")
            try:
                event = self.events.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if event.get("event") == wanted:
                return event
            if event.get("event") == "error":
                raise Stop(event["kind"], event["message"], event.get("log", ""), event.get("line"))
            if event.get("event") == EOF_EVENT:
                raise self._death(phase)

    def _death(self, phase: str) -> Stop:
        code = self.popen.wait()
        tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
        if self.name == "judge":
            last = tail.strip().splitlines()[-1:] or ["no output"]
            return Stop("runtime_error", f"the reference failed during {phase}: {last[0]}", tail)
        if code < 0:
            name = signal.Signals(-code).name
            if -code == signal.SIGKILL:
                return Stop("oom", f"the {self.name} was killed during {phase} (out of memory?)")
            return Stop("crash", f"the {self.name} died of {name} during {phase}", tail)
        if "MemoryError" in tail or "out of memory" in tail:
            return Stop("oom", f"the {self.name} ran out of memory during {phase}", tail)
        return Stop("crash", f"the {self.name} exited with code {code} during {phase}", tail)
