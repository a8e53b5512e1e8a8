"""What the server learned per kernel: one record of each step, built from its `Step` event.

Records live in the shared `MemoryStore` (namespace "lsp-suggestions", key "<uri>#task")
so that suggestions and history survive a server restart. A step optimizes the whole
file (the task), wherever the cursor was, so a file has one history. Each
`StepRecord` holds the engine's `events.Step` as it arrived (the candidate's source only
for a correct one) and, for a correct candidate, its edit *anchored by text*: the part of
the starting buffer the candidate changes, widened to the kernels it touches. A
suggestion is offered while the document still holds that text exactly once, so edits
elsewhere in the file keep it; an edit of the kernel itself drops it (and hover says so).

A record also keeps the engine's word on the step, its `Claim`: whether the engine
confirmed the candidate faster, by which comparison (timed in pairs against the code its
job started from, or against the best so far) and with which 95 % interval. Only a
confirmed claim whose lower bound clears the threshold is ever offered as an apply
action; the ratio of two speedups over PyTorch is shown only as a labelled estimate.
And it keeps a hash of that starting code, so that a strategy that did not help on this
code in one job is excluded from the next (`spent_strategies`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from htam_engine import events
from htam_engine.vocabulary import Status

if TYPE_CHECKING:
    from htam_engine.memory import MemoryStore

log = logging.getLogger(__name__)

NAMESPACE = "lsp-suggestions"
RUNNING = "lsp-running"  # uri -> the job running on it (`htam/jobState`), until it ends
HISTORY_LIMIT = 50
CONTEXT_LINES = 2  # around a change that touches no kernel
# Edits whose result holds only on this machine or changes floating-point results.
NON_PORTABLE = {
    "-march=native": re.compile(r"-march=native|-mtune=native"),
    "fast-math": re.compile(r"fast[-_]math|-Ofast"),
}


def record_key(uri: str) -> str:
    return f"{uri}#task"


@dataclass(frozen=True)
class Anchor:
    """A candidate's change as text: `old` (in the starting buffer) becomes `new`."""

    old: str
    new: str


@dataclass(frozen=True)
class Claim:
    """The engine's word on a candidate, timed in pairs: `speedup` over the code it was
    compared with (`versus`: 0 = the code its job started from, else the record number of
    the best so far then, itself confirmed faster), its 95 % bounds, and whether the
    engine confirmed the win (the step's duel, or the run's best re-timed against its
    start)."""

    confirmed: bool
    versus: int
    speedup: float
    low: float
    high: float

    def to_json(self) -> dict[str, Any]:
        return {
            "confirmed": self.confirmed,
            "versus": self.versus,
            "speedup": self.speedup,
            "low": self.low,
            "high": self.high,
        }

    @classmethod
    def from_json(cls, data: Any) -> Claim | None:
        if not isinstance(data, dict):
            return None
        numbers = [_number(data.get(k)) for k in ("speedup", "low", "high")]
        if any(n is None for n in numbers):
            return None
        speedup, low, high = (float(n or 0.0) for n in numbers)
        return cls(bool(data.get("confirmed")), int(data.get("versus") or 0), speedup, low, high)

    @property
    def bounds(self) -> tuple[float, float]:
        return self.low, self.high


def duel_claim(step: events.Step, versus: int) -> Claim | None:
    """The claim of a step's own duel against the best so far (record `versus`, 0: the
    start), or None where it had none or the duel gave no timing."""
    duel = step.versus_best
    if duel is None or duel.speedup is None or duel.bounds is None:
        return None
    low, high = duel.bounds
    return Claim(duel.confirmed, versus, duel.speedup, low, high)


@dataclass(frozen=True)
class StepRecord:
    """One finished step of a kernel's history, as the editor keeps it."""

    n: int  # 1, 2, ... over every run on this kernel
    step: events.Step
    time: float
    anchor: Anchor | None = None  # set for a correct candidate that changes something
    start: str = ""  # `text_hash` of the code its job started from
    claim: Claim | None = None  # the engine's word, timed in pairs (None: never paired)

    def to_json(self) -> dict[str, Any]:
        anchor = {"old": self.anchor.old, "new": self.anchor.new} if self.anchor else None
        return {
            "n": self.n,
            "time": self.time,
            "anchor": anchor,
            "start": self.start,
            "claim": self.claim.to_json() if self.claim else None,
            "event": events.to_json(self.step),
        }

    @classmethod
    def from_json(cls, data: Any) -> StepRecord | None:
        """The record, or None for one this version cannot read (logged, then skipped)."""
        try:
            step = events.from_json(data["event"])
            raw = data.get("anchor")
            anchor = Anchor(str(raw["old"]), str(raw["new"])) if raw else None
            if not isinstance(step, events.Step):
                raise events.EventError("not a step event")
            start = str(data.get("start") or "")
            claim = Claim.from_json(data.get("claim")) or _legacy_claim(data)
            return cls(int(data["n"]), step, float(data["time"]), anchor, start, claim)
        except (KeyError, TypeError, ValueError) as error:
            log.info("skipped an HTAM step record this version cannot read: %s", error)
            return None

    # --- the verdict's numbers ----------------------------------------------------------

    @property
    def confirmed(self) -> bool:
        """The engine confirmed the candidate faster, timed in pairs."""
        return self.claim is not None and self.claim.confirmed

    @property
    def paired(self) -> bool:
        """`speedup` was timed in pairs against the code its job started from."""
        return self.claim is not None and self.claim.versus == 0

    @property
    def estimate(self) -> float | None:
        """The ratio of the candidate's and the start's speedups over PyTorch: never
        timed against each other, so only ever shown as an estimate."""
        return self.step.speedup

    @property
    def speedup(self) -> float | None:
        """Over the code its job started from: timed in pairs where the engine did (see
        `paired`), else the estimate."""
        return self.claim.speedup if self.claim and self.paired else self.estimate

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The 95 % interval of `speedup`, where it was timed in pairs."""
        return self.claim.bounds if self.claim and self.paired else None

    @property
    def judged(self) -> float | None:
        """What the threshold is compared with: the lower bound of a confirmed claim;
        None for anything the engine did not confirm (never offered)."""
        return self.claim.low if self.claim and self.claim.confirmed else None

    @property
    def runtime_ms(self) -> float | None:
        return self.step.verdict.runtime_ms

    @property
    def start_ms(self) -> float | None:
        """The starting code's runtime: the candidate's times its speedup over it."""
        ms, gain = self.runtime_ms, self.speedup
        return ms * gain if ms is not None and gain is not None else None

    @property
    def ref_ms(self) -> float | None:
        return self.step.verdict.ref_runtime_ms

    @property
    def inputs(self) -> int:
        return self.step.verdict.inputs_checked

    @property
    def non_portable(self) -> list[str]:
        """What the candidate adds that holds only here (e.g. -march=native, fast-math)."""
        if self.anchor is None:
            return []
        return [
            label
            for label, pattern in NON_PORTABLE.items()
            if pattern.search(self.anchor.new) and not pattern.search(self.anchor.old)
        ]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _legacy_claim(data: dict[str, Any]) -> Claim | None:
    """A record of an earlier version: `paired`, `low`, `high` were the run's best re-timed
    against its start (confirmed); without them nothing was confirmed."""
    paired, low, high = (_number(data.get(k)) for k in ("paired", "low", "high"))
    if paired is None or low is None or high is None:
        return None
    return Claim(True, 0, paired, low, high)


def text_hash(text: str) -> str:
    """A short content hash of a buffer (what `StepRecord.start` holds)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def spent_strategies(history: Sequence[StepRecord], text: str) -> list[str]:
    """The strategies (local ids) tried in earlier jobs on this very code that did not help
    (failed, or not confirmed faster): jobs that started from `text`, or whose verified
    candidate `text` is (applying a result goes on from where that job was). Another text
    of the kernel may let them help: not excluded there."""
    here = text_hash(text)
    lines = {r.start for r in history if r.step.source and text_hash(r.step.source) == here}
    lines.add(here)
    spent = [r.step.local_id for r in history if not r.confirmed and r.start and r.start in lines]
    return list(dict.fromkeys(spent))


def run_claims(result: events.Result, steps: Sequence[StepRecord]) -> dict[int, Claim]:
    """The engine's last word on one run (record n -> claim): its best step re-timed in
    pairs against the start, where it did that. Its other steps keep the claims of their
    own duels; a run whose best is its start (step 0) confirms nothing more."""
    if result.best_step == 0 or result.best_speedup is None:
        return {}
    if result.best_low is None or result.best_high is None:
        return {}
    best = next((r for r in steps if r.step.step == result.best_step and r.step.correct), None)
    if best is None or not (best.confirmed or best.step.status == Status.IMPROVED):
        return {}
    return {best.n: Claim(True, 0, result.best_speedup, result.best_low, result.best_high)}


def trimmed(step: events.Step) -> events.Step:
    """The part of a `Step` event worth keeping: the verdict without its raw measurements
    (`Verdict.summary`), the source only for a correct candidate."""
    return replace(step, verdict=step.verdict.summary(), source=step.source if step.correct else "")


def anchor(start: str, candidate: str, kernels: Sequence[tuple[int, int]]) -> Anchor | None:
    """The candidate's change against `start`, widened to whole lines and to every kernel
    range (character offsets in `start`) it touches, or to a few lines of context when it
    touches none; widened further until the old text occurs once in `start`."""
    if candidate == start or not candidate:
        return None
    prefix = len(_common_prefix(start, candidate))
    suffix = len(_common_prefix(start[prefix:][::-1], candidate[prefix:][::-1]))
    lo, hi = prefix, len(start) - suffix
    touched = [(a, b) for a, b in kernels if a <= hi and lo <= b]
    context = 0 if touched else CONTEXT_LINES
    lo, hi = min([lo, *(a for a, _ in touched)]), max([hi, *(b for _, b in touched)])
    while True:
        a, b = _line_start(start, lo, context), _line_end(start, hi, context)
        if start.count(start[a:b]) == 1 or (a == 0 and b == len(start)):
            end = len(candidate) - (len(start) - b)
            return Anchor(start[a:b], candidate[a:end])
        context += 1


def _common_prefix(a: str, b: str) -> str:
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return a[:n]


def _line_start(text: str, offset: int, extra: int) -> int:
    start = text.rfind("\n", 0, offset) + 1
    for _ in range(extra):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return start


def _line_end(text: str, offset: int, extra: int) -> int:
    ended = offset > 0 and text[offset - 1] == "\n"  # `offset` already ends a line
    end = offset - 1 if ended else text.find("\n", offset)
    for _ in range(extra):
        if end == -1:
            break
        end = text.find("\n", end + 1)
    return len(text) if end == -1 else end + 1


@dataclass(frozen=True)
class Suggestion:
    """A verified candidate that still applies to the document: replace start..end."""

    record: StepRecord
    start: int  # character offsets of the anchor in the current text
    end: int

    @property
    def new(self) -> str:
        assert self.record.anchor is not None
        return self.record.anchor.new


@dataclass(frozen=True)
class Offer:
    """What a kernel's history offers the current text."""

    suggestions: list[Suggestion]  # best per strategy, fastest first
    dropped: list[StepRecord]  # would be offered, but the kernel's text changed
    slower: list[StepRecord]  # correct, applicable, not confirmed or under the threshold
    applied: list[StepRecord] = field(default_factory=list)  # the text holds its result
    untimed: list[StepRecord] = field(default_factory=list)  # correct, no time to compare


def offer(history: Sequence[StepRecord], text: str, threshold: float) -> Offer:
    """The suggestions of `history` for the current `text`: correct candidates whose
    anchor is in the text once, which the engine confirmed faster in pairs, with the
    lower bound of that 95 % interval at `threshold` or more. Nothing else is offered."""
    best: dict[str, Suggestion] = {}
    dropped: list[StepRecord] = []
    slower: list[StepRecord] = []
    applied: list[StepRecord] = []
    untimed: list[StepRecord] = []
    for record in history:
        if record.anchor is None or not record.step.correct:
            continue
        at = text.find(record.anchor.old)
        if at < 0 or text.find(record.anchor.old, at + 1) >= 0:
            (applied if record.anchor.new in text else dropped).append(record)
            continue
        if record.speedup is None and record.claim is None:
            untimed.append(record)  # e.g. Triton's interpreter: correct, never timed
            continue
        judged = record.judged
        if judged is None or judged < threshold:
            slower.append(record)
            continue
        found = Suggestion(record, at, at + len(record.anchor.old))
        held = best.get(record.step.local_id)
        if held is None or _rank(record) > _rank(held.record):
            best[record.step.local_id] = found
    ranked = sorted(best.values(), key=lambda s: _rank(s.record), reverse=True)
    return Offer(ranked, dropped, slower, applied, untimed)


def _rank(record: StepRecord) -> float:
    return record.judged or 0.0


class SuggestionStore:
    """Records in the shared memory store, with an in-process cache (reads are hot).

    Reads use a store opened in the server's thread; writes go to a second store owned
    by one writer thread, because a write may wait for a worker's transaction and the
    event loop must not.
    """

    def __init__(self, home: Path | None = None) -> None:
        self._home = home  # None: the shared HTAM home
        self._reader: MemoryStore | None = None
        self._writer: MemoryStore | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="htam-store")
        self._cache: dict[str, list[StepRecord]] = {}
        self.revision = 0  # counts changes of any history: what caches of offers key on

    @property
    def store(self) -> MemoryStore:
        """The reading `MemoryStore`, opened on first use (keeps start-up light)."""
        if self._reader is None:
            from htam_engine.memory import MemoryStore

            self._reader = MemoryStore(self._home)
        return self._reader

    def history(self, uri: str) -> list[StepRecord]:
        key = record_key(uri)
        if key not in self._cache:
            raw = self.store.get(NAMESPACE, key)
            steps = raw.get("history", []) if isinstance(raw, dict) else []
            self._cache[key] = [r for r in map(StepRecord.from_json, steps) if r is not None]
        return self._cache[key]

    def add(
        self,
        uri: str,
        step: events.Step,
        anchor: Anchor | None,
        start: str = "",
        versus: int = 0,
    ) -> Future[None]:
        """Append a step (`start`: the hash of the code its job started from; `versus`: the
        record its duel was timed against, 0 for that code): the cache now, the store in
        the writer thread."""
        history = self.history(uri)
        number = history[-1].n + 1 if history else 1
        claim = duel_claim(step, versus)
        record = StepRecord(number, trimmed(step), time.time(), anchor, start, claim)
        return self._keep(uri, [*history, record][-HISTORY_LIMIT:])

    def confirm(self, uri: str, claims: dict[int, Claim]) -> Future[None]:
        """Replace records' claims (n -> claim) with the run's last word once it ended."""
        history = [replace(r, claim=claims[r.n]) if r.n in claims else r for r in self.history(uri)]
        return self._keep(uri, history)

    def mark_running(self, uri: str, job: dict[str, Any] | None) -> Future[None]:
        """Keep that `job` runs on `uri` (None: none does), so that a step a restart of
        the server cut short is said after it (`running`)."""
        return self._pool.submit(self._put, RUNNING, uri, job)

    def running(self, uri: str) -> dict[str, Any] | None:
        """The job kept as running on `uri` (by this server or one before it)."""
        found = self.store.get(RUNNING, uri)
        return found if isinstance(found, dict) else None

    def _keep(self, uri: str, history: list[StepRecord]) -> Future[None]:
        key = record_key(uri)
        self._cache[key] = history
        self.revision += 1
        return self._pool.submit(
            self._put, NAMESPACE, key, {"history": [r.to_json() for r in history]}
        )

    def _put(self, namespace: str, key: str, record: Any) -> None:
        if self._writer is None:
            from htam_engine.memory import MemoryStore

            self._writer = MemoryStore(self._home)
        try:
            self._writer.put(namespace, key, record)
        except Exception:
            log.exception("could not store the HTAM record %s", key)
