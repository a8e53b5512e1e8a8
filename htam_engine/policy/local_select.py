"""Local selection inside one direction (design step 4) behind one interface."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from htam_engine.decisions import LocalDecision
from htam_engine.memory.model import Graph, LocalNode
from htam_engine.state import State
from htam_engine.strategies import REGISTRY

N0 = 3.0


STOP = "stop"  # the answer that ends the run and keeps the best (`LLMLocalSelector`)
OTHER = "other_direction"  # the answer that sets the chosen direction aside for this code


def unfit(node: LocalNode, state: State) -> str | None:
    """Why `node` does not fit the state's kernel by its own declarations, or None."""
    return node.fits(state.family, state.tags())


def _tie_break(node: LocalNode, tags: set[str]) -> tuple[bool, bool, int]:
    """Sort key among equal scores: mechanical first, then a compound rewrite, then the
    strategy more of whose applicability tags the state has (the more specific)."""
    rewrite = REGISTRY.get(node.mechanical) if node.mechanical else None
    compound = rewrite is not None and rewrite.compound
    return not node.mechanical, not compound, -len(set(node.applicability) & tags)


class NoApplicableStrategy(LookupError):
    """Every strategy under the chosen direction is blocked for the current code."""


class LocalSelector(Protocol):
    def choose(
        self, graph: Graph, global_id: str, state: State, applicable: Mapping[str, str | None]
    ) -> LocalDecision:
        """Pick a local node under `global_id`.

        `applicable` maps local id -> None when it can be applied to the current code,
        else the reason why not; ids absent from it count as applicable.
        """
        ...


class EvidenceLocalSelector:
    """Ranks by applicability, mechanical first, then evidence and tag match (no LLM)."""

    def choose(
        self, graph: Graph, global_id: str, state: State, applicable: Mapping[str, str | None]
    ) -> LocalDecision:
        tags = state.tags()
        nodes = graph.locals_of(global_id)
        why_not = {n.id: applicable.get(n.id) or unfit(n, state) for n in nodes}
        scored = [self._score(node, state, tags) for node in nodes]
        usable = [(lid, score, why) for lid, score, why in scored if why_not[lid] is None]
        blocked = [
            (lid, -math.inf, f"not applicable: {why_not[lid]}")
            for lid, _, _ in scored
            if why_not[lid] is not None
        ]
        # Mechanical (deterministic, cheap) strategies first only among equal scores: as a
        # score bonus it outweighed every learned utility (benchmarks/README.md, simulation).
        # Among those, a compound first (its edits pay together, where one alone is
        # refused), then the more specific (the more of its applicability tags match).
        usable.sort(key=lambda item: (-item[1], *_tie_break(graph.locals[item[0]], tags), item[0]))
        ranking = usable + sorted(blocked)
        if not usable:
            reasons = "; ".join(f"{lid}: {why_not[lid]}" for lid, _, _ in scored)
            raise NoApplicableStrategy(f"no applicable strategy under {global_id} ({reasons})")
        best_id, _, why = usable[0]
        return LocalDecision(best_id, f"{graph.locals[best_id].name}: {why}", ranking)

    @staticmethod
    def _score(node: LocalNode, state: State, tags: set[str]) -> tuple[str, float, str]:
        matches = sorted(set(node.applicability) & tags)
        match = len(matches) / len(set(node.applicability)) if node.applicability else 0.0
        utility = node.stats.utility(0.0, N0)
        best = node.evidence_positive[0].speedup if node.evidence_positive else None
        evidence = math.log(best) if best and best > 0 else 0.0
        failed_here = sum(e.task_signature == state.task_signature for e in node.evidence_negative)
        score = utility + 0.5 * match
        score += 0.2 * evidence - 0.5 * failed_here
        parts = ["mechanical" if node.mechanical else "needs an LLM"]
        if matches:
            parts.append(f"matches {', '.join(matches)}")
        if best:
            parts.append(f"best {best:.2f}x on {node.evidence_positive[0].task_signature}")
        if failed_here:
            parts.append(f"failed {failed_here}x on this task")
        parts.append(f"utility {utility:+.2f} over {node.stats.attempts} attempts")
        return node.id, score, "; ".join(parts)
