"""Correctness beyond the task's own inputs (DESIGN, "Correctness beyond the tested
inputs"): wide values, a second shape with odd sizes, bit-identical reruns."""

from pathlib import Path

import pytest
import torch
from helpers.candidates import FIXTURES, failed, measure

from htam_engine.evaluate import wider
from htam_engine.evaluate.verdict import Verdict

WIDER = FIXTURES / "wider"
EXAMPLES = Path(__file__).parent.parent / "examples"
BEYOND = ("verify.wide_values", "verify.deterministic", "verify.other_shape")


def _detail(verdict: Verdict, name: str) -> str:
    return next(check.detail for check in verdict.checks if check.name == name)


def test_an_honest_kernel_passes_every_check_beyond_the_task():
    verdict = measure(WIDER / "honest.py")
    assert verdict.correct and verdict.error is None, verdict.error
    assert not verdict.shape_only and not failed(verdict)
    assert _detail(verdict, "verify.wide_values").startswith("right for inputs scaled")
    assert _detail(verdict, "verify.deterministic").startswith("bit-identical")
    assert "batch_size=191, dim=767" in _detail(verdict, "verify.other_shape")


def test_the_example_passes_and_says_why_it_has_no_second_shape():
    verdict = measure(EXAMPLES / "softmax" / "cpu_naive.py")
    assert verdict.correct and verdict.error is None, verdict.error
    assert not verdict.shape_only and not failed(verdict)
    assert _detail(verdict, "verify.other_shape").startswith("skipped: the task's sizes are no")


def test_a_softmax_without_its_max_subtraction_is_incorrect_at_wide_values():
    verdict = measure(WIDER / "no_max.py")
    assert verdict.error is not None and verdict.error.kind == "incorrect", verdict.error
    assert failed(verdict) == ["verify.wide_values"]
    assert "NaN/Inf" in _detail(verdict, "verify.wide_values")


@pytest.mark.parametrize(("name", "why"), [("baked", "values off"), ("refuses", "ValueError")])
def test_a_kernel_right_at_the_tasks_shape_only_is_correct_but_flagged(name, why):
    verdict = measure(WIDER / f"{name}.py")
    assert verdict.correct and verdict.error is None, verdict.error
    assert verdict.shape_only and verdict.speedup is not None
    assert failed(verdict) == ["verify.other_shape"]
    detail = _detail(verdict, "verify.other_shape")
    assert "correct at the task's shape only: wrong at sizes batch_size=191" in detail
    assert why in detail
    again = Verdict.from_json(verdict.to_json())
    assert again.shape_only and again.summary().shape_only


def test_outputs_that_differ_between_two_calls_on_the_same_inputs_are_incorrect():
    verdict = measure(WIDER / "drifting.py")  # within tolerance, never bit-identical
    assert verdict.error is not None and verdict.error.kind == "incorrect", verdict.error
    assert failed(verdict) == ["verify.deterministic"]


def test_an_output_left_partly_uninitialised_is_caught_by_its_values():
    """`torch.empty` with its last row unwritten: fresh (zeroed) pages on the first
    call, so `output.values` catches it before any rerun is needed."""
    verdict = measure(WIDER / "unwritten.py")
    assert verdict.error is not None and verdict.error.kind == "incorrect", verdict.error
    assert "output.values" in failed(verdict)
    assert all(_detail(verdict, name).startswith("not run") for name in BEYOND)


def test_size_constants_and_the_other_shape():
    source = (WIDER / "reference.py").read_text()
    assert wider.size_constants(source) == {"batch_size": 256, "dim": 1024}
    assert [wider.other_size(n) for n in (8, 256, 1024, 16384)] == [5, 191, 767, 12287]
    assert wider.size_constants("N = 2048 * 2\nk = 3\nM: int = 64\nN = 'x'\n") == {"M": 64}
    module = wider.rewritten(source, WIDER / "reference.py", {"dim": 767})
    assert (module.batch_size, module.dim) == (256, 767)
    assert module.get_inputs()[0].shape == (256, 767)


@pytest.mark.parametrize(("low", "high"), [(-5.0, 4.0), (-4.0, 5.0), (-0.01, 5.0), (0.0, 1.0)])
def test_wide_values_reach_the_magnitude_on_each_side(low, high):
    """A softmax overflows past +88 only: the positive side must get there too, whichever
    side of the task's inputs reached further."""
    x = torch.tensor([low, 0.5 * high, high])
    wide = x * wider.widening(x)
    assert float(wide.max()) >= wider.WIDE_MAGNITUDE
    assert low == 0 or float(wide.min()) <= -wider.WIDE_MAGNITUDE or wide.abs().max() >= 199


def test_a_kernel_right_at_the_task_shape_only_is_no_baseline_and_says_so():
    """The loop never beats or keeps it (no baseline), the memory's note and the
    editor's history say where it is wrong."""
    from htam_engine import events
    from htam_engine.evaluate.cache import usable_as_baseline
    from htam_engine.evaluate.verdict import Check
    from htam_engine.llm.facts import failure_note
    from htam_engine.vocabulary import Status
    from htam_lsp import render

    wrong = "correct at the task's shape only: wrong at sizes dim=767 (the task's: 1024)"
    timed = {"compiled": True, "correct": True, "runtime_ms": 1.0, "speedup": 2.0}
    flagged = Verdict(**timed, shape_only=True, checks=[Check("verify.other_shape", False, wrong)])
    assert usable_as_baseline(Verdict(**timed)) and not usable_as_baseline(flagged)
    assert failure_note(flagged) == wrong and failure_note(Verdict(**timed)) == ""
    step = events.Step(1, "g", "l", "", Status.NOT_IMPROVED, 0.0, None, verdict=flagged)
    assert render.outcome(step) == "not_improved: correct at the task's shape only"
