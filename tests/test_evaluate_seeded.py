"""A forward that draws random numbers gets the judge's seed before each call on both
sides (and in the judge's own expected outputs), so a faithful candidate verifies."""

from __future__ import annotations

from pathlib import Path

from htam_engine.evaluate import Limits, evaluate
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "seeded"


def test_a_forward_drawing_torch_randn_verifies_when_both_sides_are_seeded() -> None:
    task = load_task(FIXTURES / "noisy_relu_kernel.py")
    assert task.impl_source is not None
    limits = Limits(compile_s=60, verify_s=30, time_s=60)
    verdict = evaluate(task, task.impl_source, device="cpu", limits=limits, use_cache=False)
    assert verdict.error is None, verdict.error
    assert verdict.correct and verdict.inputs_checked == 3
    assert all(check.passed for check in verdict.checks)  # timed outputs matched too
    assert verdict.speedup is not None
