"""Where a timed verdict sits against this machine's limits: the verdict's `roofline`.

A `Placement` (`roofline.place`: the task's bytes, FLOPs and special functions, the
limits it is held to, what it achieved and the fraction of the roofline time), an
`Unplaced` (a timed verdict that could not be placed, and why), or None (untimed, or
placed by no one). On the wire (`to_json`/`from_json`) they are the dict the verdict
always carried: the placement's keys, `{"why": ...}`, or `{}`.
Dependency-free: the verdict, and so the language server, imports it; `roofline` places.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

# what sets the roofline time: bytes, FLOPs, or special functions (exp, log, erf, tanh...)
Limiting = Literal["memory", "compute", "special"]
Where = Literal["core", "GPU"]  # one CPU thread (the timing policy), or the GPU

# Keys written only when set: a placement without them (as older versions wrote it) reads
# back without them.
_OPTIONAL = ("reference_fraction", "machine", "special_ops", "special_gops", "harness_ms")


@dataclass(frozen=True)
class Placement:
    """A timed kernel on the roofline: its work, the limits, what it achieved."""

    bytes: int  # the task's minimal bytes moved (inputs, outputs, parameters)
    flops: int  # counted FLOPs (matmul-class ops only)
    bound: Limiting
    where: Where
    bandwidth_gbs: float  # the bandwidth it is held to (at its footprint)
    peak_gflops: float
    roofline_ms: float  # max(bytes / bandwidth, flops / peak, special ops / exp rate)
    achieved_gbs: float
    achieved_gflops: float
    fraction: float  # (roofline time + the harness's share) / measured time
    reference_fraction: float | None = None  # PyTorch's, when timed against it
    faster_than_light: bool = False  # even the interval's slow end beats the roofline
    machine: str | None = None  # the fingerprint of the limits it was placed on
    special_ops: int | None = None  # counted special-function calls (exp-class)
    special_gops: float | None = None  # the exp rate it is held to (None: not measured)
    # The harness's own work inside every timed call (staging inputs, copying outputs
    # out): no call is faster than the roofline time plus this, so `fraction` counts it.
    harness_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in data.items() if v is not None or k not in _OPTIONAL}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Placement:
        reference, machine = data.get("reference_fraction"), data.get("machine")
        special, rate = data.get("special_ops"), data.get("special_gops")
        harness = data.get("harness_ms")
        return cls(
            int(data["bytes"]),
            int(data["flops"]),
            data["bound"],
            data["where"],
            float(data["bandwidth_gbs"]),
            float(data["peak_gflops"]),
            float(data["roofline_ms"]),
            float(data["achieved_gbs"]),
            float(data["achieved_gflops"]),
            float(data["fraction"]),
            float(reference) if reference is not None else None,
            bool(data.get("faster_than_light", False)),
            str(machine) if machine is not None else None,
            int(special) if special is not None else None,
            float(rate) if rate is not None else None,
            float(harness) if harness is not None else None,
        )


@dataclass(frozen=True)
class Unplaced:
    """A timed verdict that could not be placed: the work unknown, no limits measured."""

    why: str

    def to_json(self) -> dict[str, Any]:
        return {"why": self.why}


def to_json(roofline: Placement | Unplaced | None) -> dict[str, Any]:
    """The verdict's `roofline` on the wire: {} when there is none."""
    return roofline.to_json() if roofline is not None else {}


def from_json(data: dict[str, Any] | None) -> Placement | Unplaced | None:
    """The verdict's `roofline` from the wire (None for {}, as older rows have it)."""
    if not data:
        return None
    if "why" in data:
        return Unplaced(str(data["why"]))
    return Placement.from_json(data) if "fraction" in data else None
