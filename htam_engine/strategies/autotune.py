"""The autotuning step: a rewrite with a parameter (an unroll factor, a tile or block size,
a number of accumulators) is written with each of a few values, each variant judged like
any candidate (compiled, verified, timed against the reference), and the fastest correct
one is the step's candidate; the note says which value won and what each measured.

The step stays bounded: at most `MAX_VARIANTS` variants, and none started once
`BUDGET_S` seconds have gone by (the default, measured first, always is).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from htam_engine.evaluate.verdict import Verdict
from htam_engine.strategies.base import Rewrite

MAX_VARIANTS = 3
BUDGET_S = 90.0
AUTOTUNED = "autotuned "  # how the note of an autotuning step starts


@dataclass(frozen=True)
class Tuned:
    """The kept variant (its code and verdict), its parameter's value, and the note."""

    code: str
    verdict: Verdict
    value: int
    note: str


def tune(
    rewrite: Rewrite,
    current: str,
    measure: Callable[[str], Verdict],
    clock: Callable[[], float] = time.monotonic,
) -> Tuned | None:
    """The fastest correct variant of `rewrite` on `current` (else the default's), or
    None when the rewrite has fewer than two variants here (nothing to tune)."""
    variants = rewrite.variants(current)[:MAX_VARIANTS]
    if rewrite.param is None or len(variants) < 2:
        return None
    started = clock()
    judged: list[tuple[int, str, Verdict]] = []
    for value, code in variants:
        if judged and clock() - started > BUDGET_S:
            break
        judged.append((value, code, measure(code)))
    correct = [item for item in judged if item[2].correct]
    value, code, verdict = max(correct, key=_speed) if correct else judged[0]
    tried = ", ".join(_outcome(v, verdict) for v, _, verdict in judged)
    note = f"{AUTOTUNED}{rewrite.param.name}={value} (of {tried})"
    return Tuned(code, verdict, value, note)


def _speed(item: tuple[int, str, Verdict]) -> float:
    return item[2].speedup or 0.0


def _outcome(value: int, verdict: Verdict) -> str:
    if not verdict.correct:
        return f"{value}: {'incorrect' if verdict.compiled else 'compile error'}"
    speed = f"{verdict.speedup:.2f}x" if verdict.speedup else "untimed"
    return f"{value}: {speed} PyTorch"
