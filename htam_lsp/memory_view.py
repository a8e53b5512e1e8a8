"""htam.showMemory: a backend's learned memory as a table and as data."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from htam_engine.vocabulary import BACKENDS
from htam_lsp.documents import Document, uri_path

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph, Stats


def whose(doc: Document | None, arg: dict[str, Any]) -> str:
    """Which memory is shown and why, when the caller did not name the backend: the
    kernel's the user worked in last (the buffer asked from is none of HTAM's), or the
    default where no kernel is open."""
    if arg.get("backend"):
        return ""
    others = ", ".join(f"`{b}`" for b in BACKENDS)
    if doc is None:
        return f"No kernel is open: this is the cuda memory (name a backend for another: {others})."
    if arg.get("uri") == doc.uri:
        return ""
    name = Path(uri_path(doc.uri) or doc.uri).name
    return f"The memory of {name}, the kernel you worked in last."


def memory_summary(graph: Graph, note: str = "") -> dict[str, Any]:
    """htam.showMemory: the directions' statistics and the most used transitions (and
    `note`, which memory this is, under the heading)."""
    directions = [{"id": g.id, "name": g.name, **_stats(g.stats)} for g in graph.globals.values()]
    edges = sorted(graph.edges.values(), key=lambda e: e.stats.weight, reverse=True)[:10]
    transitions = [{"src": e.src, "dst": e.dst, "prior": e.prior, **_stats(e.stats)} for e in edges]
    lines = [
        f"### HTAM memory ({graph.backend})",
        "",
        *([note, ""] if note else []),
        "| direction | attempts | correct | improved | mean reward |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {d['name']} | {d['attempts']} | {d['correct']} | {d['improved']} "
        f"| {d['mean_reward']:+.3f} |"
        for d in directions
    ]
    return {
        "markdown": "\n".join(lines) + "\n",
        "memory": {"backend": graph.backend, "directions": directions, "transitions": transitions},
    }


def _stats(stats: Stats) -> dict[str, Any]:
    return {
        "attempts": stats.attempts,
        "correct": stats.correct,
        "improved": stats.improved,
        "weight": stats.weight,
        "mean_reward": stats.mean_reward,
    }
