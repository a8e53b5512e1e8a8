"""Process trees from /proc (stdlib only: the language server and the evaluator share it)."""

from __future__ import annotations

import os
from pathlib import Path


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def ancestors(pid: int) -> list[int]:
    """The live processes above `pid`, its parent first (empty where there is no /proc)."""
    found: list[int] = []
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return found
        pid = int(stat.rsplit(")", 1)[1].split()[1])
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
