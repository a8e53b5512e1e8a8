"""Tolerances by dtype, and the float64 precision check on verified and timed outputs."""

import pytest
import torch
from helpers.candidates import CANDIDATES, MODES, failed, measure, sandboxed

from htam_engine.evaluate import common


def test_each_dtype_has_its_tolerance_and_integers_match_exactly():
    assert common.tolerance(torch.float64) < common.tolerance(torch.float32) == 1e-4
    assert common.tolerance(torch.float16) == common.tolerance(torch.bfloat16) == 1e-2
    assert common.tolerance(torch.int32) == common.tolerance(torch.bool) == 0.0
    assert common.precision_floor(torch.float64) < common.precision_floor(torch.float32)
    assert common.precision_floor(torch.float16) is None


@pytest.mark.parametrize(
    ("name", "check"),
    [("fp64_as_fp32", "precision.float64"), ("cheap_when_timed", "timing.precision")],
)
def test_work_below_the_outputs_precision_is_cheating(name, check):
    verdict = measure(CANDIDATES / "adversarial" / f"{name}.py")
    assert verdict.error is not None and verdict.error.kind == "cheating", verdict.error
    assert check in failed(verdict) and check in verdict.error.message


@pytest.mark.parametrize("mode", MODES)
def test_an_honest_float64_kernel_is_accepted(mode, monkeypatch):
    with sandboxed(mode, monkeypatch):
        verdict = measure(CANDIDATES / "honest" / "fp64.py")
    assert verdict.correct and verdict.error is None, verdict.error
    assert not failed(verdict)
