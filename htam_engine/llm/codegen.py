"""Code from the LLM: one generation, best-of-k in parallel, and one repair turn.

Each answer comes back as a `Generated`: usable code, or None and the reason (a step
records `no_code` with it). The caller evaluates; `needs_repair` and `repair` give a
compile error or a wrong result one more try, shown the compiler's excerpt or the
verifier's mismatch (as CudaForge's judge does).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from htam_engine.llm.base import Completion, LLMError, Provider
from htam_engine.llm.extract import extract_candidate
from htam_engine.llm.limits import BudgetExhausted
from htam_engine.llm.prompts import repair_prompt

# Verdict error kinds a repair turn can fix: the code ran into a visible, local fault.
# Not timeouts, OOM or cheating: those need another strategy, not a patch.
REPAIRABLE = frozenset({"compile_error", "runtime_error", "incorrect"})
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
) -> list[Generated]:
    """Best-of-k: `k` independent generations in parallel, in sample order.

    A sample whose call fails becomes a `Generated` with no code and the error as its
    reason; if every sample failed, the first error is raised (the LLM failed, not the
    candidates)."""
    if k < 1:
        raise ValueError(f"--candidates must be at least 1, not {k}")
    with ThreadPoolExecutor(max_workers=k, thread_name_prefix="htam-llm") as pool:
        futures = [
            pool.submit(generate, provider, system, prompt, language, entry=entry, sample=i)
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


def needs_repair(verdict: Mapping[str, Any]) -> bool:
    """True for a verdict (`Verdict.to_json()`) that one repair turn may fix."""
    error = verdict.get("error") or {}
    return error.get("kind") in REPAIRABLE


def failure_text(verdict: Mapping[str, Any]) -> str:
    """What went wrong, for the repair prompt: the error, its excerpt, failed checks."""
    error = verdict.get("error") or {}
    line = f" (line {error['line']})" if error.get("line") else ""
    parts = [f"{error.get('kind', 'failure')}{line}: {error.get('message', '')}".strip()]
    if error.get("excerpt"):
        parts.append(f"```\n{str(error['excerpt']).strip()}\n```")
    failed = [c for c in verdict.get("checks") or [] if not c.get("passed", True)]
    parts += [f"- check {c.get('name')}: {c.get('detail', '')}" for c in failed[:MAX_FAILED_CHECKS]]
    return "\n".join(parts)


def repair(
    provider: Provider,
    *,
    task_source: str,
    failed_code: str,
    verdict: Mapping[str, Any],
    local_text: str,
    language: str,
    entry: str | None = None,
) -> Generated:
    """The one repair turn: the failed code and its failure in, a fixed file out."""
    system, prompt = repair_prompt(
        task_source, failed_code, failure_text(verdict), local_text, language
    )
    return generate(provider, system, prompt, language, entry=entry, purpose="repair")
