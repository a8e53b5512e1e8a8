"""Code from the LLM: one generation, best-of-k in parallel, and one repair turn.

Each answer comes back as a `Generated`: usable code, or None and the reason (a step
records `no_code` with it). `needs_repair` and `repair` give a compile error or a wrong
result one more try, shown the compiler's excerpt or the verifier's mismatch (as
CudaForge's judge does); `attempt` runs evaluate -> repair -> evaluate with the caller's
`evaluate` (anything that returns a `Verdict`; this package imports the verdict's types,
never the evaluator), and `best_of` keeps the best.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from htam_engine.evaluate.verdict import ErrorKind, Verdict
from htam_engine.llm.base import Completion, LLMError, Provider
from htam_engine.llm.extract import extract_candidate
from htam_engine.llm.limits import BudgetExhausted
from htam_engine.llm.prompts import QUOTED, fence_block, repair_prompt

# Verdict error kinds a repair turn can fix: the code ran into a visible, local fault, or
# broke a static rule at a named line (a model's first KL divergence called
# `torch.broadcast_tensors` in a side branch, and its run ended with every step left).
# Not timeouts, OOM or cheating: those need another strategy, not a patch.
REPAIRABLE = frozenset(
    {
        ErrorKind.COMPILE_ERROR,
        ErrorKind.RUNTIME_ERROR,
        ErrorKind.INCORRECT,
        ErrorKind.NOT_CUSTOM_KERNEL,
    }
)
MAX_FAILED_CHECKS = 8


@dataclass(frozen=True)
class Generated:
    """One answer: `code` to evaluate, or None and `reason` (why nothing can run)."""

    code: str | None
    reason: str
    completion: Completion | None
    sample: int = 0
    purpose: str = "generate"

    def to_json(self) -> dict[str, Any]:
        completion = self.completion
        return {
            "code": self.code is not None,
            "reason": self.reason,
            "sample": self.sample,
            "purpose": self.purpose,
            "completion": completion.to_json() | {"text": None} if completion else None,
        }


def generate(
    provider: Provider,
    system: str,
    prompt: str,
    language: str,
    *,
    entry: str | None = None,
    purpose: str = "generate",
    sample: int = 0,
) -> Generated:
    """Ask once and extract the code; `LLMError` (or `BudgetExhausted`) if the call fails."""
    completion = provider.complete(system, prompt, purpose=purpose, sample=sample)
    answer = extract_candidate(
        completion.text, language, entry=entry, truncated=completion.truncated
    )
    return Generated(answer.code, answer.reason, completion, sample, purpose)


def generate_candidates(
    provider: Provider,
    system: str,
    prompt: str,
    language: str,
    *,
    k: int,
    entry: str | None = None,
    purpose: str = "generate",
) -> list[Generated]:
    """Best-of-k: `k` independent generations in parallel, in sample order.

    A sample whose call fails becomes a `Generated` with no code and the error as its
    reason; if every sample failed, the first error is raised (the LLM failed, not the
    candidates)."""
    if k < 1:
        raise ValueError(f"--candidates must be at least 1, not {k}")
    with ThreadPoolExecutor(max_workers=k, thread_name_prefix="htam-llm") as pool:
        futures = [
            pool.submit(
                generate, provider, system, prompt, language, entry=entry, purpose=purpose, sample=i
            )
            for i in range(k)
        ]
        outcomes: list[Generated | LLMError] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except LLMError as error:
                outcomes.append(error)
    errors = [o for o in outcomes if isinstance(o, LLMError)]
    if len(errors) == k:
        raise next((e for e in errors if isinstance(e, BudgetExhausted)), errors[0])
    return [
        Generated(None, f"LLM call failed: {o}", None, i) if isinstance(o, LLMError) else o
        for i, o in enumerate(outcomes)
    ]


def needs_repair(verdict: Verdict) -> bool:
    """True for a verdict that one repair turn may fix."""
    return verdict.error_kind in REPAIRABLE


def failure_text(verdict: Verdict) -> str:
    """What went wrong, for the repair prompt: the error, its excerpt, failed checks."""
    error = verdict.error
    if error is None:
        parts = ["failure:"]
    else:
        line = f" (line {error.line})" if error.line else ""
        parts = [f"{error.kind}{line}: {error.message}".strip()]
        if error.excerpt:
            parts.append(f"Log excerpt ({QUOTED}):\n{fence_block(error.excerpt.strip())}")
    failed = [c for c in verdict.checks if not c.passed]
    parts += [f"- check {c.name}: {c.detail}" for c in failed[:MAX_FAILED_CHECKS]]
    return "\n".join(parts)


def repair(
    provider: Provider,
    *,
    task_source: str,
    failed_code: str,
    verdict: Verdict,
    local_text: str,
    language: str,
    entry: str | None = None,
    facts: str = "",
) -> Generated:
    """The one repair turn: the failed code and its failure in, a fixed file out."""
    system, prompt = repair_prompt(
        task_source, failed_code, failure_text(verdict), local_text, language, facts
    )
    return generate(provider, system, prompt, language, entry=entry, purpose="repair")


@dataclass(frozen=True)
class Attempt:
    """One candidate through evaluation and at most one repair turn.

    `code` and `verdict` are what the step learns from: the repaired version when the
    repair produced code, else the first one; `code` None means `no_code` (`reason`).
    `answers` holds the first answer and the repair's, if one ran."""

    code: str | None
    verdict: Verdict | None
    reason: str
    answers: tuple[Generated, ...]
    repair_note: str = ""

    @property
    def repaired(self) -> bool:
        """A repair turn was asked for (whether or not it gave code)."""
        return len(self.answers) > 1

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code is not None,
            "reason": self.reason,
            "repaired": self.repaired,
            "repair_note": self.repair_note,
            "answers": [answer.to_json() for answer in self.answers],
        }


def attempt(
    provider: Provider,
    first: Generated,
    evaluate: Callable[[str], Verdict],
    *,
    task_source: str,
    local_text: str,
    language: str,
    entry: str | None = None,
    repair_turn: bool = True,
    facts: str = "",
) -> Attempt:
    """Evaluate `first` (from `generate`), and on a repairable failure ask once for a fix
    and evaluate that. A repair that cannot be asked (budget spent, LLM down) or gives
    no code leaves the first verdict standing, with a note saying why."""
    if first.code is None:
        return Attempt(None, None, first.reason, (first,))
    verdict = evaluate(first.code)
    if not (repair_turn and needs_repair(verdict)):
        return Attempt(first.code, verdict, "", (first,))
    try:
        fixed = repair(
            provider,
            task_source=task_source,
            failed_code=first.code,
            verdict=verdict,
            local_text=local_text,
            language=language,
            entry=entry,
            facts=facts,
        )
    except LLMError as error:
        return Attempt(first.code, verdict, "", (first,), f"no repair turn: {error}")
    if fixed.code is None:
        note = f"the repair gave no code: {fixed.reason}"
        return Attempt(first.code, verdict, "", (first, fixed), note)
    return Attempt(fixed.code, evaluate(fixed.code), "", (first, fixed))


def best_of(attempts: Sequence[Attempt]) -> Attempt | None:
    """The attempt to keep: the fastest correct one, else the first with code, else None."""
    judged = [(a, a.verdict) for a in attempts if a.verdict is not None]
    correct = [(a, v) for a, v in judged if v.correct]
    if correct:
        return max(correct, key=lambda pair: pair[1].speedup or 0.0)[0]
    return judged[0][0] if judged else None
