"""The reward of one step (design step 7)."""

from __future__ import annotations

import math

from htam_engine.vocabulary import STATUS_TABLE

MAX_LOG_SPEEDUP = 3.0  # clip: a suspicious 50x must not dominate the memory


def reward(status: str, speedup: float | None) -> float:
    """log(speedup over the best so far) for correct code, else the status's penalty."""
    info = STATUS_TABLE.get(status)
    if info is None:
        raise ValueError(f"unknown outcome status {status!r}")
    penalty = info.penalty
    if penalty is not None:
        return penalty
    if speedup is None or speedup <= 0 or not math.isfinite(speedup):
        return 0.0
    return max(-MAX_LOG_SPEEDUP, min(MAX_LOG_SPEEDUP, math.log(speedup)))
