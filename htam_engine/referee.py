"""How a run measures its candidates and settles its wins (design, "Evaluation").

Speedups are normalised by the PyTorch reference timed in pairs with the candidate.
Ratios to the reference from two different moments still drift on a busy machine, so a
win they suggest is settled by timing the candidate in pairs against the best so far
(`evaluate.compare`), and the run's final best against its start the same way. The
`Referee` keeps the run's incumbents: the start, the best so far, and the best's paired
claim over the start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from htam_engine import stats
from htam_engine.evaluate import Duel, ErrorKind, Verdict, evaluate
from htam_engine.evaluate.cache import usable_as_baseline
from htam_engine.evaluate.runner import compare, pooled_interval
from htam_engine.task import Task
from htam_engine.vocabulary import FAILED_STATUS, Status

MAX_DUELS = 3  # runs of one ambiguous duel, pooled, before a win is given up
SURPRISING = 0.5  # a candidate at under this fraction of the best's speed is timed again

OnPhase = Callable[[int, str, str, str], None]  # step, phase, global id, local id
Judge = Callable[[float | None], Status]  # a correct step's status from its ratio to the best


@dataclass(frozen=True)
class Version:
    """One implementation of the run: its code, the step that wrote it (0: the start)
    and its verdict (None: not measured)."""

    source: str
    step: int = 0
    verdict: Verdict | None = None

    @property
    def correct(self) -> bool:
        return self.verdict is not None and self.verdict.correct

    @property
    def timing(self) -> Verdict | None:
        """Its verdict where other speedups may be measured against it."""
        usable = self.verdict is not None and usable_as_baseline(self.verdict)
        return self.verdict if usable else None

    @property
    def ref_speedup(self) -> float | None:
        """Over the PyTorch reference, where its timing is usable."""
        return self.timing.speedup if self.timing else None


class Referee:
    """Measures a run's versions and settles its wins; holds its incumbents."""

    def __init__(
        self,
        task: Task,
        *,
        device: str,
        use_cache: bool,
        margin: float,
        judge: Judge,
        cancel: threading.Event,
        on_phase: OnPhase,
    ) -> None:
        self.task, self.device, self.use_cache = task, device, use_cache
        self.margin, self.judge, self.cancel, self.on_phase = margin, judge, cancel, on_phase
        self.start = self.best = Version("")  # `begin` sets them
        self.over_start: Duel | None = None  # the best timed in pairs against the start

    def begin(self, start: Version) -> None:
        """The run stands on `start`, its best until a step beats it."""
        self.start = self.best = start
        self.over_start = None

    def promote(self, candidate: Version, duel: Duel | None) -> None:
        """`candidate` is the new best; `duel`, its timing against the old one, is its
        claim over the start where the old best was the start."""
        paired = duel is not None and duel.speedup is not None and duel.against == 0
        self.over_start = duel if paired else None
        self.best = candidate

    def estimate_over_start(self, verdict: Verdict) -> float | None:
        """A correct verdict over the start, as the ratio of their speedups over PyTorch."""
        start, ref = self.start.ref_speedup, verdict.speedup
        if not verdict.correct or not start or not ref:
            return None
        return ref / start

    def measure(self, step: int, source: str, g: str = "", local: str = "") -> Verdict:
        """A verdict fit to compare against and to show: one that `_doubtful` finds is
        measured once more (the cache then holds the second one), and the steadier of the
        two is kept."""
        verdict = self._evaluate(step, source, g, local, self.use_cache)
        if verdict.correct and self._doubtful(verdict):
            again = self._evaluate(step, source, g, local, use_cache=False)
            steadier = again.correct and not (again.noisy and not verdict.noisy)
            verdict = again if steadier else verdict
        return verdict

    def _doubtful(self, verdict: Verdict) -> bool:
        """A timing no one should act on as it stands: suspect, a cached one that is no
        baseline (recorded without the sandbox), a fresh one whose interval did not narrow
        or whose noise hides whether it beats the best, or a surprising regression (under
        `SURPRISING` of the best's speed: one disturbed timing had shown 3x slower)."""
        if verdict.suspect or (verdict.cached and not usable_as_baseline(verdict)):
            return True
        if verdict.cached or verdict.runtime_ms is None:
            return False
        best, speed, interval = self.best.ref_speedup, verdict.speedup, verdict.interval
        if not verdict.converged:
            return True
        if not best or not speed or interval is None:
            return False
        hidden = verdict.noisy and interval.high >= best * self.margin > interval.low
        return hidden or speed / best < SURPRISING

    def _evaluate(self, step: int, source: str, g: str, local: str, use_cache: bool) -> Verdict:
        def on_phase(phase: str) -> None:
            self.on_phase(step, phase, g, local)

        # the question: does it clear the best? Without one (the start), is it faster than
        # PyTorch: a start is a baseline only for estimates, wins are settled in pairs
        best = self.best.ref_speedup
        return evaluate(self.task, source, device=self.device, use_cache=use_cache,
                        cancel=self.cancel, on_phase=on_phase,
                        decide=best * self.margin if best else 1.0)  # fmt: skip

    def status(self, verdict: Verdict) -> tuple[Status, float | None]:
        """The outcome status and the speedup over the best so far (reference-normalised)."""
        kind = verdict.error_kind
        if not verdict.compiled:
            return (Status.TIMEOUT if kind == ErrorKind.TIMEOUT else Status.COMPILE_ERROR), None
        if not verdict.correct:
            return (FAILED_STATUS.get(kind, Status.INCORRECT) if kind else Status.INCORRECT), None
        if verdict.note:  # correct but not timed: nothing to compare
            return Status.NOT_IMPROVED, None
        best = self.best.ref_speedup
        ratio = verdict.speedup / best if best is not None and verdict.speedup else None
        if not usable_as_baseline(verdict):  # suspect even when re-timed: never a new best,
            return Status.NOT_IMPROVED, None  # and its number is no evidence
        return self.judge(ratio), ratio

    def decide(
        self, candidate: Version, g: str, local: str
    ) -> tuple[Status, float | None, Duel | None]:
        """A measured candidate's status, its speedup over the best so far, and the duel
        that settled an apparent win (None: it needed none)."""
        assert candidate.verdict is not None
        status, speedup = self.status(candidate.verdict)
        if status != Status.IMPROVED or self.best.ref_speedup is None:
            return status, speedup, None
        return self.settle(candidate.step, candidate.source, g, local, candidate.verdict)

    def settle(
        self, step: int, candidate: str, g: str, local: str, verdict: Verdict | None = None
    ) -> tuple[Status, float | None, Duel]:
        """An apparent win, timed in pairs against the best so far unless the reference
        ratios already decide it (`by_ratios`): improved only when the lower end of that
        interval clears the improve margin. A duel whose estimate clears the margin but
        whose interval does not is timed again in another run, up to MAX_DUELS runs in
        all, pooled (`pooled_interval`): most of a duel's interval is the spread between
        runs, which no run's own pairs narrow. The duel names the best's step."""
        against = self.best.step
        decided = self.by_ratios(verdict, self.best.timing) if verdict else None
        if decided is not None:
            return Status.IMPROVED, decided.speedup, replace(decided, against=against)
        self.on_phase(step, "confirm", g, local)
        duels: list[Verdict] = []
        while True:
            duel = self.compare(candidate, self.best.source, run=len(duels), decide=self.margin)
            if not duel.correct or not duel.interval:
                # it passed once: the candidate or the incumbent is flaky; only deception
                # is the candidate's for certain
                kind = duel.error_kind
                status = Status.CHEATING if kind == ErrorKind.CHEATING else Status.NOT_IMPROVED
                return status, None, replace(Duel.failed(kind), against=against)
            duels.append(duel)
            pooled = pooled_interval(duels)
            ambiguous = pooled.low < self.margin <= pooled.estimate
            if not ambiguous or len(duels) == MAX_DUELS or self.cancel.is_set():
                break
        confirmed = pooled.low >= self.margin and all(usable_as_baseline(d) for d in duels)
        summary = Duel.pooled(pooled, confirmed=confirmed, duels=len(duels), against=against)
        return Status.IMPROVED if confirmed else Status.NOT_IMPROVED, pooled.estimate, summary

    def by_ratios(self, verdict: Verdict | None, best: Verdict | None) -> Duel | None:
        """`verdict` over `best` from their own intervals over the reference (each widened
        by the run-to-run spread), when that alone puts it above the improve margin: a
        duel could only confirm it (None: not decided, no usable timing, or either one
        noisy: a busy machine drifts between runs beyond the spread allowed for)."""
        if verdict is None or best is None:
            return None
        if not (usable_as_baseline(verdict) and usable_as_baseline(best)):
            return None
        if verdict.noisy or best.noisy or verdict.interval is None or best.interval is None:
            return None
        over = stats.ratio(verdict.interval, best.interval)
        if stats.side(over, self.margin) <= 0:
            return None
        return Duel.pooled(over, confirmed=True, duels=0)

    def compare(
        self, candidate: str, incumbent: str, run: int = 0, decide: float | None = None
    ) -> Verdict:
        """The pair's `run`-th run timed together (each run is cached apart); a cached
        duel that is no baseline is timed again."""

        def duel(use_cache: bool) -> Verdict:
            return compare(self.task, candidate, incumbent, device=self.device,
                           cancel=self.cancel, use_cache=use_cache, run=run,
                           decide=decide)  # fmt: skip

        verdict = duel(self.use_cache)
        if verdict.cached and not usable_as_baseline(verdict):
            verdict = duel(use_cache=False)
        return verdict

    def close(self, step: int) -> bool:
        """The run's claim over its start: the best, when it was not settled against the
        start itself, timed in pairs against it. True when that took a duel."""
        done = self.best.step == 0 or self.over_start is not None
        if done or self.best.ref_speedup is None or self.cancel.is_set():
            return False
        self.over_start = self.by_ratios(self.best.timing, self.start.timing)
        if self.over_start is not None:  # decided: no need to re-time it
            return False
        self.on_phase(step, "confirm", "", "")
        duel = self.compare(self.best.source, self.start.source)
        if duel.correct and duel.interval:
            low, high = duel.interval.low, duel.interval.high
            self.over_start = Duel(duel.speedup, low, high, low >= self.margin)
        return True
