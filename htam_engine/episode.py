"""One run's step core (design, "Data flow of one step"), pure: no I/O, no evaluation.

An `Episode` holds a run's history; from it come the prefix, the state s_t, the choice of
(g_t, l_t) and, once the step is measured, the `Outcome` the memory learns. The loop, the
policy simulation (`benchmarks/simulation.py`) and the editor's hover preview all run
this code, so what the benchmark measures and what hover explains is the loop's policy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from htam_engine.memory.model import Graph, Outcome
from htam_engine.policy import (
    GlobalDecision,
    LocalDecision,
    LocalSelector,
    PolicyConfig,
    make_prefix,
    reward,
    select_global,
)
from htam_engine.state import PathEntry, State
from htam_engine.vocabulary import FIRST_STEP, STATUS_TABLE, Backend, Status

IMPROVE_MARGIN = 1.02  # below this a "faster" candidate is timing noise
UNBUILT = (Status.COMPILE_ERROR, Status.NO_CODE)


def task_signature(backend: Backend, family: str, name: str) -> str:
    """How evidence names the task it came from, e.g. "cpu:reduction:softmax"."""
    return f"{backend}:{family}:{name}"


@dataclass(frozen=True)
class Decision:
    """(g_t, l_t); the global decision holds the prefix and weights they were chosen with."""

    global_decision: GlobalDecision
    local: LocalDecision

    @property
    def global_id(self) -> str:
        return self.global_decision.chosen

    @property
    def local_id(self) -> str:
        return self.local.local_id


@dataclass
class Episode:
    backend: Backend
    family: str
    signature: str
    config: PolicyConfig = field(default_factory=PolicyConfig)
    improve_margin: float = IMPROVE_MARGIN
    path: list[PathEntry] = field(default_factory=list)

    @property
    def prefix(self) -> list[str]:
        return make_prefix(self.path, self.config.K)

    def state(
        self,
        features: set[str],
        *,
        last_speedup: float | None = None,
        best_speedup: float | None = None,
    ) -> State:
        """s_t: the task, the code's static features, the last step's feedback, the path."""
        last = self.path[-1].status if self.path else None
        return State(
            backend=self.backend,
            family=self.family,
            task_signature=self.signature,
            features=set(features),
            feedback={STATUS_TABLE[last].feedback if last else FIRST_STEP},
            last_speedup=last_speedup,
            best_speedup=best_speedup,
            path=list(self.path),
        )

    def choose_global(self, graph: Graph, state: State, rng: random.Random) -> GlobalDecision:
        return select_global(graph, self.prefix, state, self.config, rng)

    def decide(
        self,
        graph: Graph,
        state: State,
        rng: random.Random,
        selector: LocalSelector,
        applicable: dict[str, str | None] | None = None,
        chosen: GlobalDecision | None = None,
    ) -> Decision:
        """g_t over the graph's directions (unless `chosen` already), then l_t inside it
        (the ablations bypass it)."""
        chosen = chosen or self.choose_global(graph, state, rng)
        mode = self.config.mode
        if chosen.chosen_local:  # flat retrieval already picked a strategy
            local = LocalDecision(chosen.chosen_local, "flat retrieval over all strategies")
        elif mode in ("no_local", "random"):
            pick = rng.choice(sorted(n.id for n in graph.locals_of(chosen.chosen)))
            local = LocalDecision(pick, f"{mode}: uniform over runnable strategies")
        else:
            local = selector.choose(graph, chosen.chosen, state, applicable or {})
        return Decision(chosen, local)

    def judge(self, ratio: float | None) -> Status:
        """A correct step's status from its speedup over the best so far (None: no best yet)."""
        if ratio is None or ratio >= self.improve_margin:
            return Status.IMPROVED
        return Status.NOT_IMPROVED

    def finish(
        self,
        decision: Decision,
        status: Status,
        *,
        speedup: float | None = None,
        runtime_ms: float | None = None,
        compiled: bool | None = None,
        code_excerpt: str = "",
    ) -> Outcome:
        """The memory update of one measured step (speedup over the best so far); the
        step joins the path, so the next state and prefix follow from it. `compiled`
        defaults to what the status says."""
        outcome = Outcome(
            backend=self.backend,
            task_signature=self.signature,
            prefix=list(decision.global_decision.prefix),
            alphas=list(decision.global_decision.alphas),
            global_id=decision.global_id,
            local_id=decision.local_id,
            status=status,
            compiled=status not in UNBUILT if compiled is None else compiled,
            correct=status.correct,
            speedup=speedup,
            runtime_ms=runtime_ms,
            reward=reward(status, speedup),
            code_excerpt=code_excerpt,
        )
        self.path.append(PathEntry(decision.global_id, decision.local_id, status))
        return outcome


def recorded_step_seconds(trajectories: list[tuple[str, Any]], task: str) -> list[float]:
    """The wall seconds of each recorded step of `task` (of any task when none is
    recorded), from stored trajectories whose steps carry their phase times."""

    def seconds(only: str | None) -> list[float]:
        found: list[float] = []
        for _key, run in trajectories:
            if not isinstance(run, dict) or (only is not None and run.get("task") != only):
                continue
            for step in run.get("steps") or []:
                phases = step.get("phases") if isinstance(step, dict) else None
                if isinstance(phases, dict) and phases:
                    found.append(sum(float(v) for v in phases.values()))
        return found

    return seconds(task) or seconds(None)
