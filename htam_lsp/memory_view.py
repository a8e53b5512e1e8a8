"""htam.showMemory: a backend's learned memory as a table and as data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph, Stats


def memory_summary(graph: Graph) -> dict[str, Any]:
    """htam.showMemory: the directions' statistics and the most used transitions."""
    directions = [{"id": g.id, "name": g.name, **_stats(g.stats)} for g in graph.globals.values()]
    edges = sorted(graph.edges.values(), key=lambda e: e.stats.weight, reverse=True)[:10]
    transitions = [{"src": e.src, "dst": e.dst, "prior": e.prior, **_stats(e.stats)} for e in edges]
    lines = [
        f"### HTAM memory ({graph.backend})",
        "",
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
