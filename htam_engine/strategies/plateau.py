"""Plateau moves: a correct candidate that neither wins nor loses against the best may be
the base of the next step, when the memory's transitions predict a follow-up gain.

Some edits only pay with a later one (restrict pointers, then vectorize; a loop order,
then blocking). One step at a time such a first edit is refused as "not improved" and the
follow-up is tried on the old code. The HTG's edges hold exactly the evidence needed: the
utility of going from this direction to the next. The best so far is never replaced by a
non-win; the plateau candidate only serves as the starting point of one step.
"""

from __future__ import annotations

from htam_engine.evaluate.verdict import Duel
from htam_engine.memory.model import Graph

MIN_FOLLOW_UP = 0.05  # predicted reward (log speedup) of the best edge out: about 5 %
N0 = 3.0  # the pseudo-count of the edge utilities (global selection's default)


def plateau_base(graph: Graph, direction: str, duel: Duel | None) -> str | None:
    """Why the candidate timed in `duel` should be the next step's base (the edge that
    predicts a gain), or None: it needs a paired interval containing 1.0 and an edge out
    of `direction` whose utility reaches MIN_FOLLOW_UP."""
    bounds = duel.bounds if duel is not None else None
    if bounds is None or not bounds[0] <= 1.0 <= bounds[1]:
        return None
    edges = [e for (src, _), e in graph.edges.items() if src == direction]
    edges = [e for e in edges if e.dst in graph.globals]
    if not edges:
        return None
    best = max(edges, key=lambda e: e.utility(N0))
    utility = best.utility(N0)
    if utility < MIN_FOLLOW_UP:
        return None
    return f"plateau: {direction} -> {best.dst} predicts {utility:+.2f}"
