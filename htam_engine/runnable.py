"""Which strategies a run's next step may choose (design, "Applicability is data").

A strategy runs when it fits the code by its own declarations, has not failed in this run
(or, excluded, in an earlier one), was not tried on this very code (an `open_ended` one,
the model's own strategy, is a new change each time), and can be written:
its mechanical rewrite applies, or an LLM answers (also, for a strategy the seed marks
`model_writes`, where its rewrite cannot read the code: a model's GEMM is no nest the
register-tiling rewrite can read).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from htam_engine.memory import Graph, LocalNode
from htam_engine.policy import unfit
from htam_engine.state import State
from htam_engine.strategies import REGISTRY
from htam_engine.vocabulary import Status

EXCLUDED = "excluded: it failed on this task in an earlier run"
LLM_FAILURES = 2  # consecutive failed LLM generations before the run goes mechanical


@dataclass
class Runnable:
    """What a run has learned about its strategies so far; `llm`: an LLM writes code."""

    llm: bool
    failed: dict[str, Status | str] = field(default_factory=dict)
    tried: set[tuple[str, str]] = field(default_factory=set)  # (strategy, code) evaluated
    set_aside: set[tuple[str, str]] = field(default_factory=set)  # (direction, code)
    llm_failures: int = 0  # consecutive generations the LLM did not answer

    @classmethod
    def excluding(cls, llm: bool, exclude: Iterable[str]) -> Runnable:
        return cls(llm, dict.fromkeys(exclude, EXCLUDED))

    def of(self, graph: Graph, state: State, source: str) -> dict[str, str | None]:
        """None for a strategy that can run on `source` now, else the reason it cannot."""
        return {lid: self.why_not(node, state, source) for lid, node in graph.locals.items()}

    def why_not(self, node: LocalNode, state: State, source: str) -> str | None:
        if why_not := unfit(node, state):
            return f"does not fit: {why_not}"
        if node.id in self.failed and not node.open_ended:
            why = self.failed[node.id]
            return why if why == EXCLUDED else f"failed earlier in this run ({why})"
        if (node.id, source) in self.tried and not node.open_ended:
            return "already tried on the current code"
        if (node.parent, source) in self.set_aside:
            return "its direction was set aside for the current code (none of it fit)"
        refused = _rewrite_refusal(node, source)  # a rewrite's check parses the code: once
        if node.mechanical and refused is None:
            return None
        if refused and not node.model_writes:
            return refused
        if not self.llm:
            return refused or "needs an LLM (offline provider: mechanical strategies only)"
        if self.llm_given_up:
            return refused or f"needs an LLM (it failed {LLM_FAILURES} times in a row)"
        return None

    @staticmethod
    def rewrites(node: LocalNode, source: str) -> bool:
        """Whether `node`'s mechanical rewrite writes the next version of `source`."""
        return bool(node.mechanical) and _rewrite_refusal(node, source) is None

    @property
    def llm_given_up(self) -> bool:
        return self.llm_failures >= LLM_FAILURES


def _rewrite_refusal(node: LocalNode, source: str) -> str | None:
    """Why `node`'s mechanical rewrite cannot rewrite `source` (None: it can, or it has
    none)."""
    if not node.mechanical:
        return None
    rewrite = REGISTRY.get(node.mechanical)
    return rewrite.check(source) if rewrite else f"unknown rewrite {node.mechanical}"


def restrict(graph: Graph, applicable: dict[str, str | None]) -> Graph:
    """The graph without directions that have no runnable strategy right now."""
    runnable = {lid: n for lid, n in graph.locals.items() if applicable.get(lid) is None}
    parents = {n.parent for n in runnable.values()}
    return Graph(
        backend=graph.backend,
        globals={gid: g for gid, g in graph.globals.items() if gid in parents},
        locals=runnable,
        edges=graph.edges,
    )
