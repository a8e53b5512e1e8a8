"""Local selection by an LLM (design step 4), falling back to the evidence ranking.

The answer is structured (`choice_schema`: an enum of the runnable ids) where the
provider supports it, and parsed by `parse_choice` (the last object naming a runnable
id) in every form. Kept out of `htam_engine.policy.__init__` so that importing the
policy (as the language server does) never loads the LLM SDKs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from htam_engine.decisions import LocalDecision
from htam_engine.llm import LLMError, Provider, local_selection_prompt
from htam_engine.llm.structured import choice_schema, parse_choice
from htam_engine.memory.model import Graph, LocalNode
from htam_engine.policy.local_select import OTHER, STOP, EvidenceLocalSelector
from htam_engine.runnable import Runnable
from htam_engine.state import State
from htam_engine.vocabulary import BEHIND_REFERENCE


@dataclass(frozen=True)
class ChoiceRecord:
    """What the LLM's last choice was: the form used, whether it named a runnable id,
    and why not (for the step's record and the valid-choice rate)."""

    form: str
    valid: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"form": self.form, "valid": self.valid, "detail": self.detail}


def _shown(node: LocalNode, state: State) -> str:
    """A candidate for the chooser, marked where its rewrite writes the next version."""
    return node.prompt_text(state.family, rewrites=Runnable.rewrites(node, state.code))


class LLMLocalSelector:
    """Shows the LLM the state, the chosen direction and its runnable strategies only
    (those that fit the kernel); it may ask for another direction (`OTHER`) where one is
    left, and after the first step answer `stop`."""

    def __init__(self, provider: Provider, fallback: EvidenceLocalSelector | None = None) -> None:
        self.provider = provider
        self.fallback = fallback or EvidenceLocalSelector()
        self.last: ChoiceRecord | None = None

    def choose(
        self, graph: Graph, global_id: str, state: State, applicable: Mapping[str, str | None]
    ) -> LocalDecision:
        ranked = self.fallback.choose(graph, global_id, state, applicable)
        runnable = [lid for lid, score, _ in ranked.ranking if score != -math.inf]
        # once there is a result to keep, and not while PyTorch is confirmed faster
        may_stop = bool(state.path) and BEHIND_REFERENCE not in state.features
        # the model's own strategy is offered alone, when nothing named is left to ask for
        may_leave = not all(graph.locals[lid].open_ended for lid in runnable)
        system, prompt = local_selection_prompt(
            state.describe(),
            graph.globals[global_id].prompt_text(),
            [(lid, _shown(graph.locals[lid], state)) for lid in runnable],
            may_stop=may_stop,
            may_leave=may_leave,
            behind=BEHIND_REFERENCE in state.features,
            facts=state.facts,
            current_code=state.code,
        )
        answers = [*runnable, *([OTHER] if may_leave else []), *([STOP] if may_stop else [])]
        try:
            completion = self.provider.complete(
                system, prompt, purpose="local", schema=choice_schema(answers)
            )
        except LLMError as error:
            self.last = ChoiceRecord("none", False, f"LLM unavailable ({error})")
            return _fallback(ranked, self.last.detail)
        choice = parse_choice(completion.text, answers, completion.form)
        if choice is None:
            cut = " (cut off at max_tokens)" if completion.truncated else ""
            detail = f"LLM answer ({completion.form}{cut}) named no runnable strategy"
            self.last = ChoiceRecord(completion.form, False, detail)
            return _fallback(ranked, detail)
        self.last = ChoiceRecord(completion.form, True, f"chose {choice.local_id}")
        if choice.local_id == STOP:
            return LocalDecision(STOP, choice.reason or "no strategy left worth a step")
        if choice.local_id == OTHER:
            return LocalDecision(OTHER, choice.reason or "no strategy here fits the code")
        reason = choice.reason or "chosen by the LLM"
        return LocalDecision(choice.local_id, f"{reason} [LLM, {choice.form}]", ranked.ranking)


def _fallback(ranked: LocalDecision, why: str) -> LocalDecision:
    return LocalDecision(
        ranked.local_id, f"{ranked.reason} [{why}; evidence ranking used]", ranked.ranking
    )
