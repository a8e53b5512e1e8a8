"""How a step gets its candidate (design step 5): a mechanical rewrite, or LLM answers
(best-of-k) that each get one repair turn; the caller's `measure` evaluates every version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from htam_engine.evaluate import Verdict
from htam_engine.llm import Provider, attempt, best_of, generate_candidates
from htam_engine.strategies import REGISTRY
from htam_engine.task import Task

Measure = Callable[[str], Verdict]


@dataclass(frozen=True)
class Implemented:
    """The version a step learns from (`code` None: no code, `note` says why), its
    verdict, and for LLM steps what the calls did (attempts, usage)."""

    code: str | None
    verdict: Verdict | None
    note: str = ""
    llm: dict[str, Any] = field(default_factory=dict)


def language_of(task: Task) -> tuple[str, str | None]:
    """The language an answer must be written in, and the entry a `.cu` must keep."""
    return ("cuda", task.entry) if task.kind == "cu" else ("python", None)


def mechanical(rewrite_id: str, current: str, measure: Measure) -> Implemented:
    code = REGISTRY[rewrite_id].apply(current)
    return Implemented(code, measure(code))


def with_llm(
    provider: Provider,
    prompt: tuple[str, str],
    measure: Measure,
    *,
    task: Task,
    local_text: str,
    candidates: int = 1,
    purpose: str = "generate",
) -> Implemented:
    """`candidates` answers to `prompt` (system, user), each measured and given one repair
    turn on a repairable failure; the fastest correct version wins."""
    before = provider.usage.copy()
    language, entry = language_of(task)
    system, user = prompt
    firsts = generate_candidates(
        provider, system, user, language, k=candidates, entry=entry, purpose=purpose
    )
    attempts = [
        attempt(
            provider,
            first,
            measure,
            task_source=task.reference_source,
            local_text=local_text,
            language=language,
            entry=entry,
        )
        for first in firsts
    ]
    info = {
        "attempts": [a.to_json() for a in attempts],
        "usage": provider.usage.since(before).to_json(),
    }
    best = best_of(attempts)
    if best is None:
        return Implemented(None, None, attempts[0].reason, info)
    return Implemented(best.code, best.verdict, best.repair_note, info)
