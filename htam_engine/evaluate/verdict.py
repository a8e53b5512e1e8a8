"""What one evaluation says: the `Verdict`, its checks, its error and its intervals.

The one place a verdict becomes JSON and JSON a verdict (`to_json`/`from_json` on each
type): the CLI's `--json` document, the verdict cache's rows, the event stream and the
editor's stored history are all written and read here. `from_json` reads what older
versions wrote too: a missing field takes its default, an unknown key is ignored.
Dependency-free (the vocabulary, `stats` and `placement` only): the language server
imports it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from typing import Any

from htam_engine import placement
from htam_engine.placement import Placement, Unplaced
from htam_engine.stats import Interval
from htam_engine.vocabulary import UNRUNNABLE, ErrorKind

__all__ = [
    "ERROR_KINDS",
    "SUSPECT_SPEEDUP",
    "UNRUNNABLE",
    "Check",
    "Duel",
    "ErrorKind",
    "EvalError",
    "Limits",
    "Verdict",
]

ERROR_KINDS: tuple[str, ...] = tuple(kind.value for kind in ErrorKind)
SUSPECT_SPEEDUP = 10.0


@dataclass(frozen=True)
class Limits:
    """Wall-clock limits in seconds per phase, and the address-space cap of a CPU worker."""

    compile_s: float = 120.0
    verify_s: float = 60.0
    time_s: float = 120.0
    memory_mb: int = 16384
    input_sets: int = 3
    inputs_ahead_mb: int = 256  # the judge's memory for timing's input sets made ahead


SETS_AHEAD = 24  # timing's input sets a judge makes ahead, at most: more than a timing
# at its floor uses (warm-up, then a second of pairs of ~50 ms)


def sets_ahead(ahead_mb: int, set_bytes: int) -> int:
    """How many of timing's input sets a judge makes before timing starts: SETS_AHEAD,
    fewer where they would take more than `ahead_mb` (`Limits.inputs_ahead_mb`)."""
    return min(SETS_AHEAD, (ahead_mb << 20) // max(set_bytes, 1))


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Check:
        return cls(str(data["name"]), bool(data["passed"]), str(data.get("detail", "")))


@dataclass
class EvalError:
    kind: ErrorKind  # a plain string of the enum is taken (and checked)
    message: str
    excerpt: str = ""
    line: int | None = None

    def __post_init__(self) -> None:
        try:
            self.kind = ErrorKind(self.kind)
        except ValueError:
            raise ValueError(f"unknown error kind {self.kind!r}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "message": self.message,
            "excerpt": self.excerpt,
            "line": self.line,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalError:
        line = data.get("line")
        return cls(
            ErrorKind(data["kind"]),
            str(data.get("message", "")),
            str(data.get("excerpt", "")),
            int(line) if line is not None else None,
        )


def _interval_json(interval: Interval | None, within: float | None) -> dict[str, Any]:
    """`interval` on the wire: {} when not timed."""
    data = interval.to_json() if interval is not None else {}
    return data if within is None else {**data, "within_run_half_width": within}


@dataclass
class Verdict:
    """The outcome of evaluating one candidate; `to_json()` is the CLI's `--json` document."""

    compiled: bool = False
    correct: bool = False
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    device: str = "cpu"
    samples: dict[str, list[float]] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    error: EvalError | None = None
    cached: bool = False
    suspect: bool = False
    inputs_checked: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    sandbox: str = "none"  # "bwrap" or "none": how the candidate was isolated
    threads: int = 0  # the CPU thread count both reference and candidate were timed with
    note: str = ""  # why a correct verdict has no timing (Triton under its interpreter)
    # The paired speedup's 95 % interval, widened by the spread between runs, and the
    # half-width of the pairs' own interval (what `converged` compares with the device's
    # target). In JSON both are one object: `interval` with `within_run_half_width`.
    interval: Interval | None = None
    within_run_half_width: float | None = None
    # whether the timing narrowed to the device's target, the load average around it,
    # and whether those conditions make the number noisy
    converged: bool = False
    load: dict[str, float] = field(default_factory=dict)
    noisy: bool = False
    # The library policy it was judged under (aten op names the candidate may leave to
    # torch, `--allow-torch`) and those of them its calls actually ran.
    allow_torch: list[str] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)
    # When the problem was shrunk to fit (`--scale`): the factor and each size changed,
    # {"factor": 0.1, "sizes": {"batch_size": [4096, 409]}}; empty when run as written.
    scaled: dict[str, Any] = field(default_factory=dict)
    # Where a timed verdict sits against this machine's limits (`roofline.place`: bytes,
    # flops, achieved GB/s and GFLOP/s, the bound, the fraction of the roofline time);
    # None when untimed, `Unplaced` (why) when it could not be placed.
    roofline: Placement | Unplaced | None = None
    # `--baseline compile`: the candidate timed in pairs against the torch.compile'd
    # reference (`baseline.versus_compile`): speedup, bounds, the compiled reference's
    # time and compile seconds, or the error that left only eager's number.
    compile_baseline: dict[str, Any] = field(default_factory=dict)
    # Which side's build came from its own earlier, identical content ("reused") or was
    # kept for the next evaluation of it ("kept"), by side (`candidate`, `incumbent`):
    # `evaluate.builds`, under bwrap only.
    builds: dict[str, str] = field(default_factory=dict)
    # Correct at the task's shape but wrong (or refused) at another with odd sizes (the
    # failed check `verify.other_shape` says which): no plain win to apply anywhere.
    shape_only: bool = False
    # What GCC's vectorizer did with the candidate's C++ loops, a line a loop (CPU builds
    # by g++; `kernels.vectorizer_report`): the compiler's feedback for the next version.
    vectorizer: str = ""

    @property
    def error_kind(self) -> ErrorKind | None:
        return self.error.kind if self.error is not None else None

    @property
    def unrunnable(self) -> bool:
        """It says nothing about the candidate (no GPU, cancelled, the reference failed)."""
        return self.error_kind in UNRUNNABLE

    def summary(self) -> Verdict:
        """The verdict without its raw measurements (samples, spread, checks, load, phase
        times, library calls, builds, the vectorizer's report): what the editor's history
        keeps of each step."""
        return replace(
            self, samples={}, spread={}, checks=[], phase_seconds={}, load={},
            allow_torch=[], torch_ops=[], scaled={}, builds={}, vectorizer="",
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "within_run_half_width":
                continue  # inside `interval`
            value = getattr(self, f.name)
            if f.name == "interval":
                value = _interval_json(self.interval, self.within_run_half_width)
            elif f.name == "checks":
                value = [check.to_json() for check in self.checks]
            elif f.name == "error":
                value = self.error.to_json() if self.error is not None else None
            elif f.name == "roofline":
                value = placement.to_json(self.roofline)
            else:
                value = copy.deepcopy(value)
            data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        names = {f.name for f in fields(cls)} - {"within_run_half_width"}
        values = {k: copy.deepcopy(v) for k, v in data.items() if k in names}
        values["checks"] = [Check.from_json(check) for check in data.get("checks") or []]
        values["error"] = EvalError.from_json(data["error"]) if data.get("error") else None
        values["roofline"] = placement.from_json(data.get("roofline"))
        interval = data.get("interval") or {}
        values["interval"] = Interval.from_json(interval) if "estimate" in interval else None
        within = interval.get("within_run_half_width")
        values["within_run_half_width"] = float(within) if within is not None else None
        return cls(**values)


@dataclass(frozen=True)
class Duel:
    """A candidate timed in pairs against the best so far (`Step.versus_best`): the
    speedup over it pooled over `duels` runs, with its 95 % bounds, and whether that
    confirmed the win; or, for a duel that gave no timing, the error kind that ended it
    (None: correct, but untimed). `against` is the step that wrote the best it was timed
    against (0: the start), as the loop knew it."""

    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    confirmed: bool = False
    duels: int = 1
    error: ErrorKind | None = None
    against: int = 0

    @classmethod
    def pooled(cls, interval: Interval, *, confirmed: bool, duels: int, against: int = 0) -> Duel:
        return cls(interval.estimate, interval.low, interval.high, confirmed, duels, None, against)

    @classmethod
    def failed(cls, kind: ErrorKind | None) -> Duel:
        return cls(error=kind)

    @property
    def bounds(self) -> tuple[float, float] | None:
        if self.low is None or self.high is None:
            return None
        return self.low, self.high

    def to_json(self) -> dict[str, Any]:
        if self.speedup is None:
            return {
                "error": self.error.value if self.error is not None else "",
                "against": self.against,
            }
        return {
            "speedup": self.speedup,
            "low": self.low,
            "high": self.high,
            "confirmed": self.confirmed,
            "duels": self.duels,
            "against": self.against,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Duel | None:
        """The duel, or None for a step that had none (`{}` on the wire)."""
        if not data:
            return None
        against = int(data.get("against") or 0)  # absent in records of earlier versions
        if data.get("speedup") is None:
            kind = ErrorKind(data["error"]) if data.get("error") else None
            return cls(error=kind, against=against)
        low, high = data.get("low"), data.get("high")
        return cls(
            float(data["speedup"]),
            float(low) if low is not None else None,
            float(high) if high is not None else None,
            bool(data.get("confirmed", False)),
            int(data.get("duels", 1)),
            against=against,
        )
