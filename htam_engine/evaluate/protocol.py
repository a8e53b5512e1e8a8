"""What the judge and its caller (`runner`) say to each other: typed both ways.

The caller writes lines to the judge's stdin: its token first, then one command per
phase (`PREPARE`, `JOB`, `VERIFY`, `TIME`), and `SIZE` whenever it likes before `JOB`.
The judge answers each on stdout with one message below, a JSON object a line: the
message's fields plus `"event": <its EVENT>` and the caller's token (which
`process.Child` checks and strips, stamping the line with its own clock as `_t`). A judge
that stops says so with `Failed`, which `Child.wait_for` raises as a `Stop`. `encode` and
`decode` are the only translation between the two.

Dependency-free (the verdict's types only): the caller never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from htam_engine.evaluate.verdict import Check
from htam_engine.vocabulary import ErrorKind

# the caller's commands, one line each, in this order
PREPARE = "prepare"  # make the input sets (a caller may hold this while it sizes the problem)
JOB = "job"  # job.json is written: take it (a judge may stand by before its job exists)
VERIFY = "verify"
TIME = "time"
SIZE = "size"  # any number of times before JOB: the problem's sizes (`Sized`), made nothing

# A check whose failure flags a correct verdict instead of failing it: the candidate is
# right at the task's shape but wrong (or refuses) at another (`Verdict.shape_only`).
SHAPE_ONLY = "verify.other_shape"
FLAGS = frozenset({SHAPE_ONLY})


@dataclass(frozen=True)
class Sized:
    """The bytes of one input set and of its outputs, from the reference run on meta
    tensors (None: unknown, `why`)."""

    EVENT: ClassVar[str] = "sized"
    inputs: int | None
    outputs: int | None
    why: str = ""
    shapes: list[str] = field(default_factory=list)  # each input: "float32[64, 4096]"


class ProtocolError(ValueError):
    """A line of the judge that is not the message it should be."""


@dataclass(frozen=True)
class Compiled:
    """Both workers loaded their code (the candidate's compiled) in `sandbox` mode; what
    GCC's vectorizer did with the candidate's C++ loops (`kernels.vectorizer_report`, as
    its worker wrote it: text to show, never to judge by)."""

    EVENT: ClassVar[str] = "compiled"
    sandbox: str
    vectorizer: str = ""


@dataclass(frozen=True)
class Verified:
    """Every input set was checked: the verification's and the worker's runtime checks."""

    EVENT: ClassVar[str] = "verified"
    checks: list[Check]
    sets: int


@dataclass(frozen=True)
class Timing:
    """The judge holds the device's timing lock: the time phase's clock starts now."""

    EVENT: ClassVar[str] = "timing"


@dataclass(frozen=True)
class Timed:
    """The paired times in seconds (reference and candidate, in call order), the harness's
    share of a call in ms, what neighbours took (CPU accounting), the timing's checks and
    the thread count both sides ran with."""

    EVENT: ClassVar[str] = "timed"
    ref: list[float]
    cand: list[float]
    harness_ms: float
    checks: list[Check]
    threads: int
    accounting: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """The judge stopped the evaluation (`process.Stop` on its side)."""

    EVENT: ClassVar[str] = "error"
    kind: ErrorKind
    message: str
    log: str = ""
    line: int | None = None


Message = Sized | Compiled | Verified | Timing | Timed | Failed
M = TypeVar("M", Sized, Compiled, Verified, Timing, Timed, Failed)
_CHECKED = {"checks"}  # fields that are lists of `Check`
# how a decoded field of each annotated type is checked (annotations are strings here)
_AS: dict[str, Any] = {
    "str": str,
    "ErrorKind": ErrorKind,
    "int": int,
    "float": float,
    "int | None": lambda v: None if v is None else int(v),
    "list[float]": lambda v: [float(x) for x in v],
    "list[str]": lambda v: [str(x) for x in v],
    "dict[str, float]": lambda v: {str(k): float(x) for k, x in v.items()},
    "list[Check]": lambda v: [Check.from_json(check) for check in v],
}


def encode(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"event": message.EVENT}
    for f in fields(message):
        value = getattr(message, f.name)
        data[f.name] = [check.to_json() for check in value] if f.name in _CHECKED else value
    return data


def decode(data: dict[str, Any], kind: type[M]) -> M:
    """The `kind` message of one line the judge wrote (read-side keys such as `_t` and
    anything a newer judge adds are ignored)."""
    if data.get("event") != kind.EVENT:
        raise ProtocolError(f"expected a {kind.EVENT!r} message, got {str(data)[:120]}")
    try:
        values = {f.name: _AS[str(f.type)](data[f.name]) for f in fields(kind) if f.name in data}
        return kind(**values)
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        raise ProtocolError(f"malformed {kind.EVENT!r} message: {error}") from None
