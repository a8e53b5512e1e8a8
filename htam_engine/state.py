"""The optimization state s_t that the policy and the prompts look at."""

from __future__ import annotations

from dataclasses import dataclass, field

from htam_engine.report import format_speedup


@dataclass(frozen=True)
class PathEntry:
    """One past step: the direction, the strategy and how it ended (an outcome status)."""

    global_id: str
    local_id: str
    status: str


@dataclass
class State:
    """Task context, static features of the current code, the last feedback, the recent path.

    `features` uses the tag vocabulary of docs/ARCHITECTURE.md; seed triggers and
    strategy applicability are written in the same tags.
    """

    backend: str  # "cuda" | "cpu"
    family: str  # "elementwise" | "reduction" | "matmul" | "fused" | "unknown"
    task_signature: str  # stable, e.g. "cpu:softmax:f32[4096x1024]"
    features: set[str] = field(default_factory=set)
    feedback: set[str] = field(default_factory=set)  # e.g. {"first_step"}, {"compile_error"}
    last_speedup: float | None = None
    best_speedup: float | None = None
    path: list[PathEntry] = field(default_factory=list)

    def tags(self) -> set[str]:
        """Every tag a trigger can match: static features, feedback and the family."""
        return self.features | self.feedback | {self.family, self.backend}

    def describe(self) -> str:
        """A compact text form for prompts and hover."""
        recent = ", ".join(f"{p.global_id}/{p.local_id}:{p.status}" for p in self.path[-3:])
        lines = [
            f"backend={self.backend} family={self.family} task={self.task_signature}",
            f"features: {', '.join(sorted(self.features)) or 'none'}",
            f"feedback: {', '.join(sorted(self.feedback)) or 'none'}",
            f"last speedup: {format_speedup(self.last_speedup)}; "
            f"best so far: {format_speedup(self.best_speedup)}",
            f"recent path: {recent or 'none (first step)'}",
        ]
        return "\n".join(lines)
