"""`evaluate.compare`: a candidate timed in pairs against an incumbent, judged against the
reference. The incumbent sits where the reference's worker was, so it must get no say
over the candidate's correctness, and its own marks must not shape the candidate's time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from htam_engine import stats
from htam_engine.evaluate.cache import usable_as_baseline
from htam_engine.evaluate.runner import _record_conditions, compare
from htam_engine.evaluate.verdict import SUSPECT_SPEEDUP, Verdict
from htam_engine.loop import LoopConfig, Optimizer
from htam_engine.memory import MemoryStore
from htam_engine.stats import Interval
from htam_engine.task import load_task

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NAIVE = (ROOT / "examples" / "softmax" / "cpu_naive.py").read_text()


def _with_forward_prefix(source: str, line: str) -> str:
    """`source` whose forward first runs `line` (the incumbent's handicap or sabotage)."""
    head = "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    assert head in source
    return source.replace(head, head + f"        {line}\n")


@pytest.fixture
def task_path(tmp_path: Path) -> Path:
    folder = tmp_path / "softmax"
    shutil.copytree(ROOT / "examples" / "softmax", folder)
    return folder / "cpu_naive.py"


def test_the_same_code_compares_as_even(task_path: Path) -> None:
    verdict = compare(load_task(task_path), NAIVE, NAIVE, device="cpu")
    assert verdict.correct, verdict.error
    assert 0.8 < verdict.speedup < 1.25  # type: ignore[operator]
    assert verdict.interval.low <= verdict.speedup <= verdict.interval.high


def test_a_slower_incumbent_makes_the_candidate_faster(task_path: Path) -> None:
    slower = _with_forward_prefix(NAIVE, "__import__('time').sleep(0.03)")
    verdict = compare(load_task(task_path), NAIVE, slower, device="cpu")
    assert verdict.correct, verdict.error
    assert verdict.interval.low > 1.5, verdict.interval


def test_a_duel_far_above_a_slow_incumbent_is_no_suspect(task_path: Path) -> None:
    """Over 10x against the best so far is a plausible step (a naive nest reordered): the
    cap on plausible speedups is over PyTorch, so such a duel can confirm a win."""
    # ~30x: a naive call is ~20 ms; at 0.25 s (~13x) CI's noise once put the low end at 9.4x
    slowest = _with_forward_prefix(NAIVE, "__import__('time').sleep(0.6)")
    verdict = compare(load_task(task_path), NAIVE, slowest, device="cpu")
    assert verdict.correct, verdict.error
    assert verdict.interval.low > SUSPECT_SPEEDUP, verdict.interval
    assert not verdict.suspect and usable_as_baseline(verdict)


def test_a_wrong_incumbent_is_no_standard_for_the_candidate(task_path: Path) -> None:
    """Timed outputs are judged against the reference: a correct candidate stays correct
    next to an incumbent that returns zeros, and a wrong one is caught even when it
    agrees with that incumbent."""
    zeros = _with_forward_prefix(NAIVE, "return torch.zeros_like(x)")
    task = load_task(task_path)
    honest = compare(task, NAIVE, zeros, device="cpu")
    assert honest.correct, honest.error
    wrong = compare(task, zeros, zeros, device="cpu")
    assert not wrong.correct
    assert wrong.error is not None and wrong.error.kind == "incorrect"


def test_a_duel_asked_about_a_margin_says_whether_it_decided_it(task_path: Path) -> None:
    """A real duel asked about 1.02x: converged exactly when its pairs' interval narrowed
    or its interval (with its pairs: `stats.unanimous`) decided the question (which the
    verdict then records); how many pairs the machine's load leaves it is not this test's
    business."""
    slower = _with_forward_prefix(NAIVE, "__import__('time').sleep(0.02)")  # quick pairs
    verdict = compare(load_task(task_path), NAIVE, slower, device="cpu", decide=1.02)
    assert verdict.correct, verdict.error
    assert verdict.interval is not None and verdict.within_run_half_width is not None
    pairs = verdict.samples["reference"], verdict.samples["candidate"]
    decided = stats.decided(verdict.interval, 1.02, stats.unanimous(*pairs, 1.02)) != 0
    assert verdict.converged == (verdict.within_run_half_width <= 0.05 or decided)
    assert ("decided_at" in verdict.spread) == decided


def test_a_decided_timing_is_converged_however_wide() -> None:
    """The caller's side of the rule: a 30-pair timing far above the question is
    converged though wider than the target; without a question it is not."""
    for decide, converged in ((1.02, True), (None, False), (1.6, False)):
        verdict = _timed(2.0, 1.7, 2.3)
        verdict.interval = Interval(2.0, 1.7, 2.3, 30)
        verdict.within_run_half_width = 0.12
        _record_conditions(verdict, 0.0, 0.05, decide)
        assert verdict.converged is converged, decide
        assert ("decided_at" in verdict.spread) is converged


def _timed(speedup: float, low: float, high: float, **flags: bool) -> Verdict:
    return Verdict(
        compiled=True,
        correct=True,
        runtime_ms=1.0,
        speedup=speedup,
        interval=Interval(speedup, low, high, 20),
        sandbox="bwrap",
        converged=True,
        **flags,
    )


def test_a_win_the_reference_ratios_decide_needs_no_duel(task_path: Path) -> None:
    """3x over the best on both sides' intervals: decided without timing a duel (0
    duels); a candidate just over the margin, or any noisy timing, is left to a duel."""
    with MemoryStore() as store:
        loop = Optimizer(load_task(task_path), NAIVE, provider=None, store=store,
                         config=LoopConfig(steps=1, device="cpu"))  # fmt: skip
        best = _timed(0.2, 0.18, 0.22)
        decided = loop.referee.by_ratios(_timed(0.6, 0.55, 0.66), best)
        assert decided is not None and decided.duels == 0 and decided.confirmed
        assert decided.speedup == pytest.approx(3.0) and decided.low > 1.02  # type: ignore[operator]
        assert loop.referee.by_ratios(_timed(0.21, 0.19, 0.23), best) is None
        assert loop.referee.by_ratios(_timed(0.6, 0.55, 0.66, noisy=True), best) is None
        assert loop.referee.by_ratios(_timed(0.6, 0.55, 0.66, suspect=True), best) is None
        assert loop.referee.by_ratios(_timed(0.6, 0.55, 0.66), None) is None
