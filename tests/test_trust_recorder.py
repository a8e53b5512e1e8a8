"""Torch doing the work is found from the judge's side: the harness's raw op record
must hold every canary op the judge asked for (`runtime.recorder`), and the judge, not
the worker, decides what in it is torch compute (`runtime.torch_ops`)."""

import pytest
from helpers.candidates import CANDIDATES, failed, measure

from htam_engine.evaluate import common


@pytest.mark.parametrize(
    ("name", "kind", "check"),
    [
        ("recorder_swap", "cheating", "runtime.recorder"),
        ("recorder_filter", "cheating", "runtime.recorder"),
        ("recorder_stopped", "cheating", "runtime.recorder"),
        ("recorder_layout", "not_custom_kernel", "runtime.torch_ops"),
        ("dispatch_off", "not_custom_kernel", "runtime.torch_ops"),
    ],
)
def test_switching_the_recorder_off_is_caught_by_the_judge(name, kind, check):
    verdict = measure(CANDIDATES / "adversarial" / f"{name}.py")
    assert verdict.error is not None and verdict.error.kind == kind, verdict.error
    assert check in failed(verdict), verdict.checks


def test_the_judge_reads_canaries_and_compute_from_the_raw_record():
    assert common.torch_compute({"frac": 3, "empty": 2}, 3) == ([], "")
    compute, missing = common.torch_compute({"frac": 1, "softmax": 4}, 3)
    assert compute == ["softmax"] and "2 of the judge's 3 canary ops are missing" in missing
    assert common.torch_compute({"frac": 5}, 3)[0] == ["frac"]  # beyond the canaries
