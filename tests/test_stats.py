"""Paired speedups and their bootstrap intervals."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from htam_engine.stats import (
    DECIDE_MIN_PAIRS,
    UNANIMOUS_MIN_MS,
    UNANIMOUS_MIN_PAIRS,
    Z95,
    Interval,
    decided,
    job_settled,
    paired_speedup,
    pooled,
    ratio,
    settled,
    side,
    unanimous,
)


def noisy_pairs(speedup: float, n: int, noise: float, seed: int) -> tuple[list[float], list[float]]:
    """Pairs whose machine load moves both sides together (common mode) plus own noise."""
    rng = random.Random(seed)
    ref, cand = [], []
    for _ in range(n):
        load = rng.choice([1.0, 1.0, 1.0, 8.0])  # a busy neighbour, now and then
        ref.append(1e-3 * load * rng.lognormvariate(0, noise))
        cand.append(1e-3 / speedup * load * rng.lognormvariate(0, noise))
    return ref, cand


def test_a_real_speedup_is_found_through_common_mode_load() -> None:
    ref, cand = noisy_pairs(2.0, 60, 0.05, seed=1)
    interval = paired_speedup(ref, cand)
    assert interval.low < 2.0 < interval.high
    assert interval.low > 1.8 and interval.high < 2.2
    assert interval.pairs == 60


def test_no_speedup_keeps_one_inside_the_interval() -> None:
    ref, cand = noisy_pairs(1.0, 40, 0.1, seed=2)
    interval = paired_speedup(ref, cand)
    assert interval.low < 1.0 < interval.high


def test_more_pairs_narrow_the_interval() -> None:
    few = paired_speedup(*noisy_pairs(1.5, 10, 0.15, seed=3))
    many = paired_speedup(*noisy_pairs(1.5, 200, 0.15, seed=3))
    assert many.half_width < few.half_width
    assert many.narrow(0.05) and not few.narrow(0.05)


def test_the_same_pairs_give_the_same_interval() -> None:
    pairs = noisy_pairs(1.3, 30, 0.1, seed=4)
    assert paired_speedup(*pairs) == paired_speedup(*pairs)


@pytest.mark.parametrize(("ref", "cand"), [([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0])])
def test_unpaired_or_impossible_times_are_rejected(ref: list[float], cand: list[float]) -> None:
    with pytest.raises(ValueError):
        paired_speedup(ref, cand)


def test_an_interval_is_shown_with_its_flags() -> None:
    from htam_engine.evaluate.verdict import Verdict
    from htam_engine.formatting import format_interval

    interval = Interval(1.46, 1.41, 1.52, 40)
    assert format_interval(Verdict(correct=True, interval=interval)) == "1.46x (95 % 1.41-1.52)"
    noisy = Verdict(correct=True, interval=interval, noisy=True, suspect=True)
    assert format_interval(noisy) == "1.46x (95 % 1.41-1.52) noisy suspect"
    assert format_interval(Verdict(interval=interval)) == "-"
    assert format_interval(Verdict(correct=True, note="not timed")) == "-"


def test_a_duel_is_shown_with_its_runs_or_why_it_failed() -> None:
    from htam_engine.evaluate.verdict import Duel, ErrorKind
    from htam_engine.formatting import format_duel

    once = Duel.pooled(Interval(1.05, 0.99, 1.11, 40), confirmed=False, duels=1)
    assert format_duel(once) == "1.05x (95 % 0.99-1.11)"
    assert format_duel(replace(once, duels=3)) == "1.05x (95 % 0.99-1.11), 3 runs"
    by_ratios = replace(once, duels=0)
    assert format_duel(by_ratios) == "1.05x (95 % 0.99-1.11), from the reference ratios"
    assert format_duel(Duel.failed(ErrorKind.CRASH)) == "failed (crash)"
    assert format_duel(Duel.failed(None)) == "failed (no timing)"
    assert format_duel(None) == "-"


def test_an_interval_stays_honest_when_the_machine_state_lasts_several_pairs() -> None:
    """Log-ratio noise that persists from pair to pair (AR(1), phi 0.7): resampling pairs
    one by one covers the true speedup in about 69 % of these runs; blocks of pairs
    must do better."""
    covered = 0
    for seed in range(150):
        rng, drift, ref = random.Random(seed), 0.0, []
        for _ in range(40):
            drift = 0.7 * drift + rng.gauss(0, 0.05)
            ref.append(1.3e-3 * math.exp(drift))
        interval = paired_speedup(ref, [1e-3] * 40, resamples=400)
        covered += interval.low <= 1.3 <= interval.high
    assert covered / 150 >= 0.75


def test_run_to_run_spread_widens_an_interval_and_keeps_its_estimate() -> None:
    within = paired_speedup(*noisy_pairs(1.5, 60, 0.05, seed=5))
    between = within.with_run_to_run(0.03)
    assert between.estimate == within.estimate and between.pairs == within.pairs
    assert between.low < within.low and between.high > within.high
    assert between.half_width > 0.05 > within.half_width  # 1.96 x 3 % alone is ~5.9 %
    assert within.with_run_to_run(0.0) == within


def test_pooled_runs_narrow_with_their_number_and_keep_the_geometric_mean() -> None:
    one = pooled([(1.1, 0.01, 50)], 0.045)
    assert one.estimate == pytest.approx(1.1)
    assert one.low == pytest.approx(1.1 / one.high * 1.1)  # symmetric on the log scale
    three = pooled([(1.05, 0.01, 50), (1.1, 0.01, 50), (1.15, 0.01, 50)], 0.045)
    assert three.estimate == pytest.approx((1.05 * 1.1 * 1.15) ** (1 / 3))
    assert three.pairs == 150
    assert three.half_width < one.half_width / 1.6  # about 1 / sqrt(3) of it
    with pytest.raises(ValueError):
        pooled([], 0.045)


def test_pooled_runs_cover_the_true_ratio_when_runs_differ_by_cv() -> None:
    """Each run's ratio is off by its own run-level error (CV 4.5 %) plus a within-run
    error its half-width states: pooled intervals of 3 runs hold the true ratio at about
    the stated 95 %."""
    rng = random.Random(11)
    cv, within, covered, trials = 0.045, 0.01, 0, 2000
    for _ in range(trials):
        runs = [
            (1.1 * math.exp(rng.gauss(0, cv) + rng.gauss(0, within / Z95)), within, 40)
            for _ in range(3)
        ]
        interval = pooled(runs, cv)
        covered += interval.low <= 1.1 <= interval.high
    assert 0.92 <= covered / trials <= 0.99


def test_side_says_where_an_interval_lies_against_a_threshold() -> None:
    interval = Interval(1.5, 1.4, 1.6, 20)
    assert side(interval, 1.2) == 1
    assert side(interval, 1.7) == -1
    assert side(interval, 1.5) == 0
    assert side(interval, 1.4) == 1  # the lower end on the threshold clears it
    assert side(interval, None) == 0


def test_timing_stops_once_the_question_is_decided_not_only_when_narrow() -> None:
    """A 3x candidate is decided against a 1.02x question long before its interval is
    5 % wide; one at the margin is not, and narrowness alone still stops it."""
    wide_far = paired_speedup(*noisy_pairs(3.0, 24, 0.4, seed=5))
    assert not wide_far.narrow(0.05)
    assert settled(wide_far, 0.05, 1.02, 0.045)
    assert not settled(wide_far, 0.05, None, 0.045)  # no question: only narrowness
    near = paired_speedup(*noisy_pairs(1.03, 24, 0.4, seed=6))
    assert not settled(near, 0.05, 1.02, 0.045)
    narrow = Interval(1.03, 1.02, 1.04, 40)
    assert settled(narrow, 0.05, 1.02, 0.045)


def test_the_decision_allows_for_the_run_to_run_spread() -> None:
    """Wholly above the threshold within the run, but not once widened by what the next
    run could show: not decided."""
    interval = Interval(1.08, 1.06, 1.10, 40)
    assert side(interval, 1.02) == 1
    assert not settled(interval, 0.01, 1.02, 0.045)
    assert settled(interval, 0.01, 1.02, 0.0)


def test_a_judge_s_job_carries_the_rule() -> None:
    pairs = noisy_pairs(3.0, 30, 0.4, seed=5)
    assert job_settled(*pairs, 0.05, 1.02, 0.045)
    assert not job_settled(*pairs, 0.05, None, 0.045)


def test_a_ratio_of_two_runs_intervals_adds_their_widths() -> None:
    a, b = Interval(2.0, 1.8, 2.2, 30), Interval(1.0, 0.9, 1.1, 40)
    over = ratio(a, b)
    assert over.estimate == pytest.approx(2.0)
    assert over.pairs == 30
    below = math.hypot(math.log(2.0 / 1.8), math.log(1.1 / 1.0))
    assert over.low == pytest.approx(2.0 * math.exp(-below))
    assert over.low < a.low / b.estimate and over.high > a.high / b.estimate  # wider
    assert ratio(b, b).low < 1.0 < ratio(b, b).high


def test_a_decision_allows_for_its_many_looks() -> None:
    """Each look at the interval is a chance to stop on luck: a decision needs
    DECIDE_MIN_PAIRS pairs and an interval DECIDE_WIDEN times as wide."""
    clear = Interval(1.5, 1.3, 1.7, DECIDE_MIN_PAIRS)
    assert decided(clear, 1.02) == 1 and decided(clear, 2.0) == -1
    assert decided(replace(clear, pairs=DECIDE_MIN_PAIRS - 1), 1.02) == 0
    # wholly above 1.25 as it is, not once widened for the looks
    assert side(clear, 1.25) == 1 and decided(clear, 1.25) == 0
    assert decided(clear, None) == 0


def test_dear_pairs_all_on_one_side_decide_sooner() -> None:
    """Every pair below 1x, over calls that took UNANIMOUS_MIN_MS: UNANIMOUS_MIN_PAIRS
    pairs decide what otherwise takes DECIDE_MIN_PAIRS. One pair on the other side, fewer
    pairs, or cheaper ones, and they do not."""
    cheap = noisy_pairs(0.5, UNANIMOUS_MIN_PAIRS, 0.05, seed=3)  # 1-2 ms calls
    ref, cand = ([1e5 * t for t in times] for times in cheap)  # the same, 100-200 ms
    assert sum(ref) + sum(cand) >= UNANIMOUS_MIN_MS
    assert unanimous(ref, cand, 1.0) and not unanimous(ref, cand, 0.5)
    assert not unanimous(ref, cand, None) and not unanimous(*cheap, 1.0)
    interval = paired_speedup(ref, cand).with_run_to_run(0.045)
    assert decided(interval, 1.0) == 0  # too few pairs for the bootstrap alone
    assert decided(interval, 1.0, one_sided=True) == -1
    assert decided(replace(interval, pairs=UNANIMOUS_MIN_PAIRS - 1), 1.0, one_sided=True) == 0
    rule = (0.0, 1.0, 0.045)  # target half-width, decide threshold, run-to-run cv
    assert job_settled(ref, cand, *rule) and not job_settled(*cheap, *rule)
    cand[4] = ref[4] / 1.1  # one pair above 1x
    assert not unanimous(ref, cand, 1.0) and not job_settled(ref, cand, *rule)
