"""How a step gets its candidate (design step 5): a mechanical rewrite, or LLM answers
(best-of-k) that each get one repair turn; the caller's `measure` evaluates every version.
The prompts those answers are asked with are built here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from htam_engine.evaluate import Verdict
from htam_engine.evaluate.runner import timing_threads
from htam_engine.events import Step
from htam_engine.llm import Provider, attempt, best_of, generate_candidates
from htam_engine.llm import facts as llm_facts
from htam_engine.llm.prompts import generation_prompt, translation_prompt
from htam_engine.memory import LocalNode
from htam_engine.strategies import REGISTRY, autotune
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
    """The rewrite's candidate, measured; a rewrite with a parameter is autotuned: a few
    values each measured, the fastest correct kept, the note naming it."""
    tuned = autotune.tune(REGISTRY[rewrite_id], current, measure)
    if tuned is not None:
        return Implemented(tuned.code, tuned.verdict, tuned.note)
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
    facts_text: str = "",
) -> Implemented:
    """`candidates` answers to `prompt` (system, user), each measured and given one repair
    turn on a repairable failure (told `facts_text`, as the prompt); the fastest correct
    version wins."""
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
            facts=facts_text,
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


def facts(
    task: Task,
    start: Verdict | None,
    best: Verdict | None,
    best_step: int,
    shapes: Sequence[str] = (),
    shown: int | None = None,
    code: Verdict | None = None,
) -> str:
    """The facts every prompt of `task` carries: machine, checks, shapes (`shapes`: the
    judge's sizing of its inputs, where known) and times (`shown`: the step whose code the
    prompt shows, where not the best's; `code`: that code's verdict)."""
    return llm_facts.facts_block(
        backend=task.backend,
        threads=timing_threads(),
        reference=task.reference_source,
        allowed=task.allow_torch,
        start=start,
        best=best,
        best_step=best_step,
        shapes=shapes,
        shown=shown,
        code=code,
    )


def first_version_prompt(task: Task, facts_text: str) -> tuple[str, str]:
    """(system, prompt) for the first version of a task without one (step 0)."""
    return translation_prompt(task.reference_source, task.backend, facts_text)


def first_version(provider: Provider, task: Task, facts_text: str, measure: Measure) -> Implemented:
    """The LLM's first version of a task without one (step 0), measured."""
    prompt = first_version_prompt(task, facts_text)
    local_text = "a first, correct custom-kernel version of the reference"
    return with_llm(provider, prompt, measure, task=task, local_text=local_text,
                    purpose="translate", facts_text=facts_text)  # fmt: skip


def next_version_prompt(
    task: Task,
    node: LocalNode,
    *,
    family: str,
    signature: str,
    current: str,
    steps: list[Step],
    facts_text: str,
    reason: str = "",
) -> tuple[str, str]:
    """(system, prompt) for the next version of `current` by `node`'s strategy: the run's
    attempts so far (the last failed one's code too), why the strategy was chosen
    (`reason`), its example and the warnings of its failures elsewhere (this task's own
    failures are among the attempts)."""
    example = node.example(family)
    return generation_prompt(
        task_source=task.reference_source,
        current_code=current,
        feedback=llm_facts.attempts_text(steps),
        local_text=node.prompt_text(family),
        positive_example=example.code_excerpt if example else None,
        negative_warnings=[
            f"{e.status} on {e.task_signature}: {e.note}"
            for e in node.evidence_negative
            if e.note and e.task_signature != signature
        ],
        language=language_of(task)[0],
        facts=facts_text,
        reason=reason,
        failed=last_failure(steps),
    )


def last_failure(steps: list[Step]) -> tuple[str, str] | None:
    """The code of the run's last step that failed with code, and why (None: none did)."""
    for step in reversed(steps):
        if step.source and not step.verdict.correct:
            return step.source, llm_facts.failure_note(step.verdict) or str(step.status)
    return None
