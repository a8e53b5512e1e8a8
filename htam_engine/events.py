"""The typed event stream of a run: what `htam optimize --events` writes, one JSON object a
line, and what the language server reads back.

Dependency-free (the server imports it without the engine's heavy modules: the verdict's
types are light). On the wire each event is its fields plus `"event": <kind>`, with
`global`/`local` for the ids; a step's decisions, verdict and duel are written and read
by their own `to_json`/`from_json`.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from htam_engine.decisions import GlobalDecision, LocalDecision
from htam_engine.evaluate.verdict import Duel, EvalError, Verdict
from htam_engine.vocabulary import Status

_WIRE = {"global_id": "global", "local_id": "local"}
_FROM_WIRE = {wire: name for name, wire in _WIRE.items()}


class EventError(ValueError):
    """A line that is not an event of this stream."""


@dataclass(frozen=True)
class Start:
    kind: ClassVar[str] = "start"
    task: str
    steps: int
    provider: str
    provider_reason: str
    device: str


@dataclass(frozen=True)
class Phase:
    """A step (0: the starting implementation) entered a phase: select, generate, compile,
    verify, time, confirm (a duel) or update; `left_s`, the run's seconds left as
    estimated from recorded phase times (None: nothing recorded yet)."""

    kind: ClassVar[str] = "phase"
    step: int
    steps: int
    phase: str
    global_id: str = ""
    local_id: str = ""
    time: float = 0.0
    left_s: float | None = None


@dataclass(frozen=True)
class Step:
    """One finished step: the decision, the verdict (a step without code has the empty
    one) and the candidate; `speedup` is over the starting implementation."""

    kind: ClassVar[str] = "step"
    step: int
    global_id: str
    local_id: str
    reason: str
    status: Status
    reward: float
    speedup: float | None
    decision: GlobalDecision | None = None  # None (`{}` on the wire): no choice (step 0)
    local_decision: LocalDecision | None = None
    verdict: Verdict = field(default_factory=Verdict)
    source: str = ""
    prompt_tokens: int = 0
    note: str = ""  # why there was no code, or how a repair turn went
    llm: dict[str, Any] = field(default_factory=dict)  # LLM attempts and this step's usage
    # the candidate timed in pairs against the best so far, which confirmed or refused
    # a win the reference ratios suggested (None: it had no such duel; `{}` on the wire)
    versus_best: Duel | None = None
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds spent in each phase

    @property
    def compiled(self) -> bool:
        return self.verdict.compiled

    @property
    def correct(self) -> bool:
        return self.verdict.correct

    @property
    def ref_speedup(self) -> float | None:
        """The candidate over the PyTorch reference, for a correct candidate."""
        return self.verdict.speedup if self.correct else None

    @property
    def error(self) -> EvalError | None:
        return self.verdict.error


@dataclass(frozen=True)
class Result:
    """How the run ended; the steps came before as `Step` events."""

    kind: ClassVar[str] = "result"
    run_id: str
    task: str
    correct: bool
    best_speedup: float | None  # best correct implementation over the starting one
    ref_speedup: float | None  # ... over the PyTorch reference
    best_step: int
    stopped: str
    output_dir: str
    note: str = ""  # what the numbers can say, e.g. correctness only (not timed)
    best_low: float | None = None  # the 95 % interval of best_speedup (None: not timed)
    best_high: float | None = None
    start_error: EvalError | None = None  # why the code the run started from failed, if it did


@dataclass(frozen=True)
class Failed:
    """The run could not start or went wrong; always the last event when there is no Result."""

    kind: ClassVar[str] = "error"
    message: str
    error_kind: str = "user_error"


Event = Start | Phase | Step | Result | Failed
KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (Start, Phase, Step, Result, Failed)}


class PhaseClock:
    """Wall seconds per phase, from one phase's start to the next's: `enter` a phase,
    `lap` to take (and restart) the seconds counted since the last lap. From the steps
    already counted (and `recorded` ones of earlier runs) it estimates a run's time left."""

    def __init__(self, recorded: list[float] | None = None) -> None:
        self.phase: str | None = None
        self.since = time.monotonic()
        self.counted: dict[str, float] = {}
        self.step_s: list[float] = list(recorded or [])  # seconds per step, earliest first
        self.lap_at = self.since

    def enter(self, phase: str) -> None:
        self._close()
        self.phase = phase

    def _close(self) -> None:
        now = time.monotonic()
        if self.phase is not None:
            self.counted[self.phase] = self.counted.get(self.phase, 0.0) + now - self.since
        self.since = now

    def lap(self, step: bool = True) -> dict[str, float]:
        """The seconds of each phase since the last lap; a `step` lap also counts
        towards the per-step estimate."""
        self._close()
        counted, self.counted, self.phase = self.counted, {}, None
        if step and counted:
            self.step_s.append(time.monotonic() - self.lap_at)
        self.lap_at = time.monotonic()
        return {phase: round(seconds, 3) for phase, seconds in counted.items()}

    def left_s(self, steps_left: int) -> float | None:
        """The run's seconds left: `steps_left` steps (the current one included) at the
        median recorded step time, less what the current step has already taken."""
        if not self.step_s:
            return None
        typical = statistics.median(self.step_s[-9:])
        return round(max(0.0, steps_left * typical - (time.monotonic() - self.lap_at)), 1)


def to_json(event: Event) -> dict[str, Any]:
    data = {f.name: copy.deepcopy(getattr(event, f.name)) for f in fields(event)}
    if isinstance(event, Step):
        data["decision"] = event.decision.to_json() if event.decision else {}
        data["local_decision"] = event.local_decision.to_json() if event.local_decision else {}
        data["verdict"] = event.verdict.to_json()
        data["versus_best"] = event.versus_best.to_json() if event.versus_best else {}
    if isinstance(event, Result):
        data["start_error"] = event.start_error.to_json() if event.start_error else None
    return {"event": event.kind, **{_WIRE.get(k, k): v for k, v in data.items()}}


def to_line(event: Event) -> str:
    return json.dumps(to_json(event))


def from_json(data: Any) -> Event:
    """The event of one decoded JSON object; unknown keys are ignored (a newer engine)."""
    if not isinstance(data, dict) or data.get("event") not in KINDS:
        raise EventError(f"not an event: {str(data)[:120]}")
    cls = KINDS[data["event"]]
    names = {f.name for f in fields(cls)}
    wire = {_FROM_WIRE.get(str(k), str(k)): v for k, v in data.items() if k != "event"}
    values: dict[str, Any] = {k: v for k, v in wire.items() if k in names}
    try:
        if cls is Step:
            values["status"] = Status(values["status"])
            chosen, local = values.get("decision"), values.get("local_decision")
            values["decision"] = GlobalDecision.from_json(chosen) if chosen else None
            values["local_decision"] = LocalDecision.from_json(local) if local else None
            values["verdict"] = Verdict.from_json(values.get("verdict") or {})
            values["versus_best"] = Duel.from_json(values.get("versus_best"))
        if cls is Result and values.get("start_error"):
            values["start_error"] = EvalError.from_json(values["start_error"])
        return cls(**values)
    except (TypeError, ValueError, KeyError, AttributeError) as error:  # a missing field
        raise EventError(f"malformed {data['event']} event: {error}") from None


def parse_line(raw: bytes | str) -> Event:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise EventError(f"not JSON: {error}") from None
    return from_json(data)
