"""The reward of one step (design step 7)."""

from __future__ import annotations

import math

# Fixed penalties: a wrong answer is worse than code that does not build, which is
# worse than no code at all (nothing was risked).
PENALTIES: dict[str, float] = {
    "incorrect": -1.0,
    "crash": -1.0,
    "timeout": -0.75,
    "compile_error": -0.5,
    "no_code": -0.25,
}
MAX_LOG_SPEEDUP = 3.0  # clip: a suspicious 50x must not dominate the memory


def reward(status: str, speedup: float | None) -> float:
    """log(speedup over the best so far) for correct code, else the status's penalty."""
    if status in PENALTIES:
        return PENALTIES[status]
    if status not in ("improved", "not_improved"):
        raise ValueError(f"unknown outcome status {status!r}")
    if speedup is None or speedup <= 0 or not math.isfinite(speedup):
        return 0.0
    return max(-MAX_LOG_SPEEDUP, min(MAX_LOG_SPEEDUP, math.log(speedup)))
