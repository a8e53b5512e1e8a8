"""The autotuning step: a rewrite's parameter values written as distinct variants, each
judged, the fastest correct kept and named; bounded in variants and time."""

from __future__ import annotations

from collections.abc import Callable

from helpers.examples import EXAMPLES

from htam_engine.evaluate.verdict import Verdict
from htam_engine.implement import mechanical
from htam_engine.strategies import REGISTRY, autotune
from htam_engine.strategies.base import Param

SOFTMAX = (EXAMPLES / "softmax" / "cpu_naive.py").read_text()
UNROLL = REGISTRY["cpu.unroll"]


def _timed(speedups: dict[str, float | None]) -> Callable[[str], Verdict]:
    """A measure answering by the unroll factor in the code (None: incorrect)."""

    def measure(code: str) -> Verdict:
        factor = next(f for f in speedups if f"#pragma GCC unroll {f}\n" in code)
        speedup = speedups[factor]
        return Verdict(compiled=True, correct=speedup is not None, speedup=speedup)

    return measure


def test_each_value_is_a_distinct_variant_default_first() -> None:
    assert isinstance(UNROLL.param, Param)
    variants = UNROLL.variants(SOFTMAX)
    assert [value for value, _ in variants] == list(UNROLL.param.tried())
    assert variants[0][0] == UNROLL.param.default
    assert len({code for _, code in variants}) == len(variants)
    for value, code in variants:
        assert f"#pragma GCC unroll {value}\n" in code


def test_the_fastest_correct_variant_is_kept_and_named() -> None:
    measure = _timed({"2": 1.1, "4": 0.9, "8": None})
    made = mechanical("cpu.unroll", SOFTMAX, measure)
    assert made.code is not None and "#pragma GCC unroll 2\n" in made.code
    assert made.verdict is not None and made.verdict.speedup == 1.1
    assert made.note.startswith(f"{autotune.AUTOTUNED}unroll=2")
    assert "8: incorrect" in made.note


def test_no_correct_variant_keeps_the_default_to_learn_from() -> None:
    tuned = autotune.tune(UNROLL, SOFTMAX, _timed({"2": None, "4": None, "8": None}))
    assert tuned is not None and tuned.value == 4 and not tuned.verdict.correct


def test_the_budget_stops_further_variants() -> None:
    ticks = iter([0.0, 0.0, autotune.BUDGET_S + 1.0, autotune.BUDGET_S + 2.0])
    asked: list[str] = []

    def measure(code: str) -> Verdict:
        asked.append(code)
        return Verdict(compiled=True, correct=True, speedup=1.0)

    tuned = autotune.tune(UNROLL, SOFTMAX, measure, clock=lambda: next(ticks))
    assert tuned is not None and len(asked) == 2


def test_a_rewrite_without_a_parameter_is_not_tuned() -> None:
    restrict = REGISTRY["cpu.restrict"]
    assert restrict.param is None and restrict.variants(SOFTMAX) == []
    assert autotune.tune(restrict, SOFTMAX, _timed({})) is None
