"""The records of a step's choice (design steps 3 and 4): the global decision with every
number that went into it, and the local one with its ranking. Hover, the event stream
and the trajectories keep them; light (no parser, no strategy), so that the event
stream's readers need nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class PrefixWeight:
    k: int  # 1 = the most recent step
    source: str
    relevance: float
    alpha: float


@dataclass
class EdgeTerm:
    src: str
    k: int
    alpha: float
    n: float
    mean: float
    prior: float
    utility: float
    contribution: float


@dataclass
class Candidate:
    id: str
    name: str
    parent: str | None  # the global direction of a local candidate (flat mode)
    edge_terms: list[EdgeTerm]
    node_n: float
    node_mean: float
    node_utility: float
    trigger_matches: list[str]
    trigger_total: int
    trigger: float
    score: float
    probability: float = 0.0


@dataclass
class GlobalDecision:
    """The choice and every number that went into it (hover shows this)."""

    chosen: str
    chosen_local: str | None  # set in flat mode, where a local strategy is chosen directly
    mode: str
    temperature: float
    prefix: list[str]
    weights: list[PrefixWeight]
    candidates: list[Candidate] = field(default_factory=list)
    draw: float = 0.0

    @property
    def alphas(self) -> list[float]:
        """Weights aligned with `prefix` (oldest first), as `Outcome.alphas` expects."""
        return [w.alpha for w in reversed(self.weights)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["alphas"] = self.alphas
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GlobalDecision:
        """The decision `to_json` wrote; fields a record of an earlier version lacks take
        neutral defaults, keys it does not know are ignored."""
        candidates = [
            Candidate(**{**_known(Candidate, c, CANDIDATE_DEFAULTS),
                         "edge_terms": [EdgeTerm(**_known(EdgeTerm, t, TERM_DEFAULTS))
                                        for t in c.get("edge_terms", [])]})
            for c in data.get("candidates", [])
        ]  # fmt: skip
        return cls(
            chosen=str(data.get("chosen") or ""),
            chosen_local=data.get("chosen_local"),
            mode=str(data.get("mode") or "htam"),
            temperature=float(data.get("temperature") or 0.0),
            prefix=[str(p) for p in data.get("prefix", [])],
            weights=[
                PrefixWeight(**_known(PrefixWeight, w, WEIGHT_DEFAULTS))
                for w in data.get("weights", [])
            ],  # fmt: skip
            candidates=candidates,
            draw=float(data.get("draw") or 0.0),
        )


WEIGHT_DEFAULTS: dict[str, Any] = {"k": 1, "source": "", "relevance": 0.0, "alpha": 0.0}
TERM_DEFAULTS: dict[str, Any] = {"src": "", "k": 1, "alpha": 0.0, "n": 0.0, "mean": 0.0,
                                 "prior": 0.0, "utility": 0.0, "contribution": 0.0}  # fmt: skip
CANDIDATE_DEFAULTS: dict[str, Any] = {
    "id": "", "name": "", "parent": None, "node_n": 0.0, "node_mean": 0.0,
    "node_utility": 0.0, "trigger_matches": [], "trigger_total": 0, "trigger": 0.0,
    "score": 0.0, "probability": 0.0,
}  # fmt: skip


def _known(cls: type, data: Mapping[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`data`'s values for the fields of dataclass `cls`, `defaults` for the missing ones."""
    names = {f.name for f in fields(cls)}
    return {**defaults, **{k: v for k, v in data.items() if k in names}}


@dataclass
class LocalDecision:
    """The chosen strategy, why, and the full ranking (blocked strategies last)."""

    local_id: str
    reason: str
    ranking: list[tuple[str, float, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "local_id": self.local_id,
            "reason": self.reason,
            "ranking": [{"id": i, "score": s, "why": w} for i, s, w in self.ranking],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LocalDecision:
        ranking = [
            (str(r.get("id", "")), float(r.get("score", 0.0)), str(r.get("why", "")))
            for r in data.get("ranking", [])
        ]
        return cls(str(data.get("local_id", "")), str(data.get("reason", "")), ranking)
