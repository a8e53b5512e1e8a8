"""Process trees from /proc (stdlib only: the language server and the evaluator share it)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc `stat` file after the command's name (which may hold spaces
    and parentheses): the state first, then the parent. OSError: the task is gone."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int(stat_fields(f"{entry.path}/stat")[1])
        except OSError:
            continue  # the process ended while we looked
    return parents


def ancestors(pid: int) -> list[int]:
    """The live processes above `pid`, its parent first (empty where there is no /proc)."""
    found: list[int] = []
    while True:
        try:
            pid = int(stat_fields(f"/proc/{pid}/stat")[1])
        except OSError:
            return found
        if pid <= 0:
            return found
        found.append(pid)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (a daemon that left its session included, as long
    as it was not reparented outside the tree); empty where there is no /proc."""
    if not Path("/proc").is_dir():
        return []
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def naming(text: str) -> list[int]:
    """Live processes (zombies and this one left out) whose command line holds `text`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            named = text.encode() in Path(entry.path, "cmdline").read_bytes()
            if named and stat_fields(f"{entry.path}/stat")[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue  # the process ended while we looked
    return found


def kill_naming(text: str, limit_s: float = 2.0) -> None:
    """SIGKILL every process whose command line names `text` (a job's folder: its
    sandboxes, workers and what they forked, wherever they were reparented; the init
    of a sandbox's PID namespace ignores any other signal), again until none is left."""
    deadline = time.monotonic() + limit_s
    while (pids := naming(text)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
