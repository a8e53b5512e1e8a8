"""How HTAM writes its numbers: a speedup, its 95 % bounds, a duel, a verdict's interval,
its place on the roofline and its torch.compile baseline. Pure formatting, dependency-free:
the report, the prompts' facts, the CLI and the language server all write them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from htam_engine.placement import Placement

if TYPE_CHECKING:
    from htam_engine.evaluate.verdict import Duel, Verdict


def format_speedup(value: float | None) -> str:
    """The one way a speedup is written: "1.46x", or "n/a" when there is none."""
    return "n/a" if value is None else f"{value:.2f}x"


def format_bounds(bounds: Sequence[float]) -> str:
    """The one way 95 % bounds are written: "95 % 1.02-1.10"."""
    return f"95 % {bounds[0]:.2f}-{bounds[1]:.2f}"


def format_bounded(value: float | None, bounds: Sequence[float] | None) -> str:
    """A speedup with its 95 % bounds where it has them: "1.06x (95 % 1.02-1.10)"."""
    if value is None or not bounds:
        return format_speedup(value)
    return f"{format_speedup(value)} ({format_bounds(bounds)})"


def format_duel(duel: Duel | None) -> str:
    """A step's timing in pairs against the best so far (`Step.versus_best`):
    "1.05x (95 % 0.99-1.11), 3 runs", "failed (crash)"; "-" when it had none."""
    if duel is None:
        return "-"
    if duel.speedup is None:
        return f"failed ({duel.error or 'no timing'})"
    text = format_bounded(duel.speedup, duel.bounds)
    if duel.duels == 0:  # the reference ratios decided it: no duel was needed
        return f"{text}, from the reference ratios"
    return text if duel.duels == 1 else f"{text}, {duel.duels} runs"


def format_interval(verdict: Verdict) -> str:
    """A timed verdict's speedup over PyTorch with its 95 % interval and flags:
    "1.46x (95 % 1.41-1.52)", "... noisy", "... suspect"; "-" when not timed."""
    interval = verdict.interval
    if not verdict.correct or interval is None:
        return "-"
    text = format_bounded(interval.estimate, (interval.low, interval.high))
    flags = [name for name, on in (("noisy", verdict.noisy), ("suspect", verdict.suspect)) if on]
    return " ".join([text, *flags])


def format_roofline(verdict: Verdict) -> str:
    """A timed verdict's fraction of its roofline: "61 % memory", "26 % exp" (special
    functions bind); "-" when not placed."""
    light = verdict.roofline
    if not isinstance(light, Placement):
        return "-"
    flag = " faster than light" if light.faster_than_light else ""
    bound = "exp" if light.bound == "special" else light.bound
    return f"{100 * light.fraction:.0f} % {bound}{flag}"


def format_compile(verdict: Verdict) -> str:
    """The speedup over the torch.compile'd reference: "1.10x (95 % 1.02-1.19; compiled
    in 31 s)", or why there is none."""
    base = verdict.compile_baseline
    if base.get("error"):
        return f"n/a (torch.compile failed: {base['error'][:200]})"
    if base.get("speedup") is None:
        return "-"
    bounds = format_bounds((base["low"], base["high"]))
    return f"{format_speedup(base['speedup'])} ({bounds}; compiled in {base['compile_s']:.0f} s)"
