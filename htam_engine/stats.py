"""Speedups from paired timings, with a bootstrap interval (pure Python, no numpy).

Reference and candidate trials alternate, so each pair saw the same machine state; the
speedup is the median over pairs of ref/candidate (on the log scale, where the ratio's
noise is symmetric), and its 95 % interval comes from resampling the pairs.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

CONFIDENCE = 0.95
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval
RESAMPLES = 2000
STOP_RESAMPLES = 500  # at a look at whether to stop: a cheaper bootstrap


@dataclass(frozen=True)
class Interval:
    """A speedup (ref time / candidate time) and its interval, from `pairs` pairs."""

    estimate: float
    low: float
    high: float
    pairs: int

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the estimate (0.05 = +-5 %)."""
        return (self.high - self.low) / (2 * self.estimate)

    def narrow(self, target: float) -> bool:
        return self.half_width <= target

    def with_run_to_run(self, cv: float) -> Interval:
        """Widened, on the log scale and in quadrature, by the spread `cv` that one kernel's
        speedup shows between evaluations (fresh workers, another moment): pairs within
        one run cannot see it, so without it an interval is too narrow for the next run."""
        extra = Z95 * math.log1p(cv)
        below = math.hypot(math.log(self.estimate / self.low), extra)
        above = math.hypot(math.log(self.high / self.estimate), extra)
        low, high = self.estimate * math.exp(-below), self.estimate * math.exp(above)
        return Interval(self.estimate, low, high, self.pairs)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "half_width": self.half_width}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interval:
        """From `to_json`'s object (its derived `half_width`, and any other key, ignored;
        no `pairs`: 0)."""
        estimate, low, high = (float(data[k]) for k in ("estimate", "low", "high"))
        return cls(estimate, low, high, int(data.get("pairs", 0)))


def side(interval: Interval, threshold: float | None) -> int:
    """Which side of `threshold` the interval lies wholly on: 1 above (low >= threshold),
    -1 below (high < threshold), 0 across it (or no threshold: nothing to decide)."""
    if threshold is None:
        return 0
    if interval.low >= threshold:
        return 1
    return -1 if interval.high < threshold else 0


# A timing that stops when its interval clears a threshold looks at the interval many
# times, and each look is another chance to stop on a lucky stretch: a decision asks for
# an interval 1.5x as wide (on the log scale) and at least 20 pairs. With them the final
# intervals hold the long-run speedup as often as under the width rule alone (simulated
# with `benchmarks/bench_noise.py --simulate`), at a third of the pairs far from it.
# Where every pair lies on the decided side and the pairs are dear, 10 are enough: were
# the long-run speedup the threshold itself, 10 of 10 on one side would happen 2 times in
# 2^10 (a sign test), and a slow candidate's 200 ms calls need not run 20 times to be found
# slow. Dear means that the pairs' calls took a second in all (100 ms a pair), as the
# shortest timing does (`judging.MIN_TIMING_S`): pairs that short see few states of the
# machine, and cheap pairs are better spent steadying the estimate (a 22 ms softmax whose
# pairs were disturbed stopped at 11 with 0.20x where its other runs said 0.16x).
DECIDE_WIDEN = 1.5
DECIDE_MIN_PAIRS = 20
UNANIMOUS_MIN_PAIRS = 10
UNANIMOUS_MIN_MS = 1000.0


def unanimous(
    reference_ms: Sequence[float], candidate_ms: Sequence[float], threshold: float | None
) -> bool:
    """Whether every pair's speedup lies on the same side of `threshold`, over pairs whose
    calls took UNANIMOUS_MIN_MS in all (None, or cheaper pairs: False)."""
    if threshold is None or sum(reference_ms) + sum(candidate_ms) < UNANIMOUS_MIN_MS:
        return False
    at = math.log(threshold)
    logs = log_ratios(reference_ms, candidate_ms)
    return all(x > at for x in logs) or all(x < at for x in logs)


def decided(interval: Interval, threshold: float | None, one_sided: bool = False) -> int:
    """`side` of `interval` (run-to-run spread included) with the allowance for many
    looks: widened by DECIDE_WIDEN, and 0 below DECIDE_MIN_PAIRS pairs, or below
    UNANIMOUS_MIN_PAIRS where its pairs are `unanimous` (`one_sided`)."""
    fewest = UNANIMOUS_MIN_PAIRS if one_sided else DECIDE_MIN_PAIRS
    if threshold is None or interval.pairs < fewest:
        return 0
    e = interval.estimate
    low = e * math.exp(DECIDE_WIDEN * math.log(interval.low / e))
    high = e * math.exp(DECIDE_WIDEN * math.log(interval.high / e))
    return side(Interval(e, low, high, interval.pairs), threshold)


def settled(
    interval: Interval,
    target: float,
    threshold: float | None,
    cv: float,
    one_sided: bool = False,
) -> bool:
    """The sequential stopping rule of a timing: stop once the pairs' own interval is
    narrow (`target`), or once that interval widened by the run-to-run spread `cv`
    (what the next run could show) is `decided` above or below `threshold`, the margin
    the question asks about (None: only narrowness stops it)."""
    widened = interval.with_run_to_run(cv)
    return interval.narrow(target) or decided(widened, threshold, one_sided) != 0


def job_settled(
    reference_ms: Sequence[float],
    candidate_ms: Sequence[float],
    target: float,
    threshold: float | None,
    cv: float,
) -> bool:
    """`settled` for a judge's pairs (a cheaper bootstrap, and `unanimous` pairs decide
    sooner), with its job's target half-width, `decide` threshold (None: none) and
    run-to-run spread `cv`."""
    interval = paired_speedup(reference_ms, candidate_ms, resamples=STOP_RESAMPLES)
    agree = unanimous(reference_ms, candidate_ms, threshold)
    return settled(interval, target, threshold, cv, agree)


def ratio(a: Interval, b: Interval) -> Interval:
    """a's speedup over b's, both over the same reference from separate runs: the ratio
    of estimates, each side's log-scale half-widths added in quadrature (independent
    runs); `pairs` is the smaller count."""
    below = math.hypot(math.log(a.estimate / a.low), math.log(b.high / b.estimate))
    above = math.hypot(math.log(a.high / a.estimate), math.log(b.estimate / b.low))
    centre = a.estimate / b.estimate
    return Interval(
        centre, centre * math.exp(-below), centre * math.exp(above), min(a.pairs, b.pairs)
    )


def pooled(runs: Sequence[tuple[float, float, int]], cv: float) -> Interval:
    """One speedup from `runs` separate timings of the same pair, each given as (estimate,
    within-run half-width, pairs): the geometric mean, with an interval whose within-run
    part and run-to-run part (`cv`, as in `Interval.with_run_to_run`) both shrink with
    the number of runs. A within-run half-width stands in for its log-scale one (they
    agree to first order; these are a few per cent)."""
    if not runs:
        raise ValueError("pooling needs at least one run")
    k = len(runs)
    centre = statistics.fmean(math.log(estimate) for estimate, _, _ in runs)
    within = math.sqrt(sum(half * half for _, half, _ in runs)) / k
    half = math.hypot(within, Z95 * math.log1p(cv) / math.sqrt(k))
    pairs = sum(count for _, _, count in runs)
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), pairs)


def log_ratios(reference_s: Sequence[float], candidate_s: Sequence[float]) -> list[float]:
    if len(reference_s) != len(candidate_s) or not reference_s:
        raise ValueError("paired timing needs the same number (> 0) of times on both sides")
    if min(*reference_s, *candidate_s) <= 0:
        raise ValueError("times must be positive")
    return [math.log(r / c) for r, c in zip(reference_s, candidate_s, strict=True)]


def paired_speedup(
    reference_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """The median pair's speedup with a percentile-bootstrap interval of that median.

    Pairs are resampled in runs of consecutive ones (a moving-block bootstrap, blocks of
    about sqrt(n) pairs): a machine's state lasts longer than one pair, so neighbouring pairs
    share their error, and resampling them one by one would make the interval too
    narrow whenever the state drifted during the timing."""
    logs = log_ratios(reference_s, candidate_s)
    rng = random.Random(seed)
    medians = sorted(statistics.median(_block_resample(logs, rng)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[int(math.ceil((1 - tail) * (resamples - 1)))]
    estimate = statistics.median(logs)
    return Interval(math.exp(estimate), math.exp(low), math.exp(high), len(logs))


def _block_resample(values: list[float], rng: random.Random) -> list[float]:
    """len(values) values, drawn as blocks of consecutive ones from random starts."""
    n = len(values)
    block = max(1, round(n**0.5))
    drawn: list[float] = []
    while len(drawn) < n:
        start = rng.randrange(n - block + 1)
        drawn.extend(values[start : start + block])
    return drawn[:n]
