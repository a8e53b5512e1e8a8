"""Local selection by an LLM (design step 4), falling back to the evidence ranking.

Kept out of `htam_engine.policy.__init__` so that importing the policy (as the
language server does) never loads the LLM SDKs.
"""

from __future__ import annotations

from collections.abc import Mapping

from htam_engine.llm import LLMError, Provider, extract_json, local_selection_prompt
from htam_engine.memory.model import Graph
from htam_engine.policy.local_select import EvidenceLocalSelector, LocalDecision
from htam_engine.state import State


class LLMLocalSelector:
    """Shows the LLM the state, the chosen direction and its runnable strategies only."""

    def __init__(self, provider: Provider, fallback: EvidenceLocalSelector | None = None) -> None:
        self.provider = provider
        self.fallback = fallback or EvidenceLocalSelector()

    def choose(
        self, graph: Graph, global_id: str, state: State, applicable: Mapping[str, str | None]
    ) -> LocalDecision:
        ranked = self.fallback.choose(graph, global_id, state, applicable)
        runnable = [lid for lid, _, _ in ranked.ranking if applicable.get(lid) is None]
        system, prompt = local_selection_prompt(
            state.describe(),
            graph.globals[global_id].prompt_text(),
            [(lid, graph.locals[lid].prompt_text()) for lid in runnable],
        )
        try:
            answer = extract_json(self.provider.complete(system, prompt, purpose="local").text)
        except LLMError as error:
            return _fallback(ranked, f"LLM unavailable ({error})")
        choice = answer.get("local") if answer else None
        if choice not in runnable:
            return _fallback(ranked, f"LLM answer named no runnable strategy ({choice!r})")
        reason = str(answer.get("reason") or "chosen by the LLM") if answer else ""
        return LocalDecision(str(choice), reason, ranked.ranking)


def _fallback(ranked: LocalDecision, why: str) -> LocalDecision:
    return LocalDecision(
        ranked.local_id, f"{ranked.reason} [{why}; evidence ranking used]", ranked.ranking
    )
