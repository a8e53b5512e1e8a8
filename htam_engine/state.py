"""The optimization state s_t that the policy and the prompts look at."""

from __future__ import annotations

from dataclasses import dataclass, field

from htam_engine.formatting import format_speedup
from htam_engine.vocabulary import Backend, Status


@dataclass(frozen=True)
class PathEntry:
    """One past step: the direction, the strategy and how it ended (an outcome status)."""

    global_id: str
    local_id: str
    status: Status


@dataclass
class State:
    """Task context, static features of the current code, the last feedback, the recent path.

    `features` uses the tag vocabulary of docs/ARCHITECTURE.md; seed triggers and
    strategy applicability are written in the same tags.
    """

    backend: Backend
    family: str  # one of `vocabulary.FAMILIES` ("unknown" when none fits)
    task_signature: str  # `episode.task_signature`, e.g. "cpu:reduction:softmax"
    features: set[str] = field(default_factory=set)
    feedback: set[str] = field(default_factory=set)  # e.g. {"first_step"}, {"compile_error"}
    last_speedup: float | None = None
    best_speedup: float | None = None
    path: list[PathEntry] = field(default_factory=list)
    threads: int = 1  # the thread count timing runs with (`evaluate.runner.timing_threads`)
    report: str = ""  # the last steps in the feedback vocabulary (`llm.facts.feedback`)
    facts: str = ""  # the times and limits the code prompt shows (`llm.facts.times_text`)
    code: str = ""  # the current implementation, for a chooser's prompt

    def tags(self) -> set[str]:
        """Every tag a trigger can match: static features, feedback, the family and the
        timing's thread policy."""
        timing = "multi_thread_timing" if self.threads > 1 else "single_thread_timing"
        return self.features | self.feedback | {self.family, self.backend, timing}

    def describe(self) -> str:
        """A compact text form for prompts and hover; speedups are over the starting
        implementation (the run's best was kept only when it won its paired duel)."""
        recent = ", ".join(f"{p.global_id}/{p.local_id}:{p.status}" for p in self.path[-3:])
        lines = [
            f"backend={self.backend} family={self.family} task={self.task_signature}",
            f"features: {', '.join(sorted(self.features)) or 'none'}",
            f"timing: {self.threads} thread(s) for every side",
            self.report
            or f"over the start: last step {format_speedup(self.last_speedup)}, "
            f"best kept {format_speedup(self.best_speedup)}",
            f"recent path: {recent or 'none (first step)'}",
        ]
        return "\n".join(lines)
