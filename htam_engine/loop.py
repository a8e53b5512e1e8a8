"""The T-step HTAM loop (design, "Data flow of one step").

state s_t -> global direction g_t (transition-aware) -> local strategy l_t -> candidate
c_{t+1} (mechanical rewrite or LLM) -> verdict (isolated worker) -> memory update.

Speedups are normalised by the PyTorch reference timed in pairs with the candidate.
Ratios to the reference from two different moments still drift on a busy machine, so
a win they suggest is settled by timing the candidate in pairs against the best so far
(`evaluate.compare`), and the run's final best against its start the same way.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from htam_engine import events, implement, parsing, roofline
from htam_engine.episode import IMPROVE_MARGIN, Decision, Episode, task_signature
from htam_engine.evaluate import Duel, ErrorKind, Verdict, evaluate, standby
from htam_engine.evaluate.cache import usable_as_baseline
from htam_engine.evaluate.runner import compare, pooled_interval
from htam_engine.events import Phase, Step
from htam_engine.implement import Implemented
from htam_engine.llm import LLMError, Provider, generation_prompt, translation_prompt
from htam_engine.memory import START, Graph, LocalNode, MemoryStore
from htam_engine.policy import EvidenceLocalSelector, LocalSelector, PolicyConfig
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import State
from htam_engine.strategies import REGISTRY
from htam_engine.task import Task
from htam_engine.triton_backend import CORRECTNESS_ONLY
from htam_engine.vocabulary import FAILED_STATUS, Status

Emit = Callable[[events.Event], None]
TRAJECTORIES = "trajectories"
MAX_DUELS = 3  # runs of one ambiguous duel, pooled, before a win is given up
TRANSLATE = "translate"  # the local id of step 0 when the LLM writes the first version
EXCLUDED = "excluded: it failed on this task in an earlier run"


class RunStopped(Exception):
    """The run cannot go on for a reason unrelated to any strategy (e.g. cancelled)."""


@dataclass
class LoopConfig:
    steps: int = 6
    device: str = "auto"
    seed: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    improve_margin: float = IMPROVE_MARGIN
    candidates: int = 1  # LLM answers per step (best-of-k)
    use_cache: bool = True  # False: no verdict is read from the cache (all are written)
    exclude: tuple[str, ...] = ()  # strategies (local ids) never chosen: failed in earlier runs


@dataclass
class RunResult:
    run_id: str
    task: str
    backend: str
    provider: str
    start_verdict: Verdict | None
    steps: list[Step] = field(default_factory=list)
    best_source: str = ""
    best_step: int = 0  # 0 = the starting implementation
    translation: Step | None = None  # step 0 when the LLM wrote the starting implementation
    best_correct: bool = False  # the best implementation passed verification
    note: str = ""  # what the run's numbers can say (e.g. correctness only, not timed)
    best_ref_speedup: float | None = None
    start_ref_speedup: float | None = None
    # the best timed in pairs against the start (`Optimizer._duel_start`): the estimate
    # and its 95 % bounds
    best_over_start: float | None = None
    best_interval: tuple[float, float] | None = None
    stopped: str = "completed"
    output_dir: str = ""

    @property
    def correct(self) -> bool:
        return self.best_correct

    @property
    def best_speedup(self) -> float | None:
        """Best correct implementation over the starting one: timed against it in pairs
        where that was done, else the ratio of their speedups over the reference."""
        if self.best_over_start is not None:
            return self.best_over_start
        if self.best_ref_speedup is None or not self.start_ref_speedup:
            return None
        return self.best_ref_speedup / self.start_ref_speedup

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "task": self.task,
            "backend": self.backend,
            "provider": self.provider,
            "correct": self.correct,
            "note": self.note,
            "best_speedup": self.best_speedup,
            "best_interval": list(self.best_interval) if self.best_interval else None,
            "ref_speedup": self.best_ref_speedup,
            "best_step": self.best_step,
            "stopped": self.stopped,
            "output_dir": self.output_dir,
            "start_verdict": self.start_verdict.to_json() if self.start_verdict else {},
            "best_source": self.best_source,
            "translation": _step_json(self.translation) if self.translation else None,
            "steps": [_step_json(s) for s in self.steps],
        }

    def result_event(self) -> events.Result:
        return events.Result(
            run_id=self.run_id,
            task=self.task,
            correct=self.correct,
            best_speedup=self.best_speedup,
            ref_speedup=self.best_ref_speedup,
            best_step=self.best_step,
            stopped=self.stopped,
            output_dir=self.output_dir,
            note=self.note,
            best_low=self.best_interval[0] if self.best_interval else None,
            best_high=self.best_interval[1] if self.best_interval else None,
        )


def _step_json(step: Step) -> dict[str, Any]:
    """A step as trajectories and `--json` keep it: the candidate is in the output folder."""
    data = events.to_json(step)
    del data["event"], data["source"]
    return data


class Optimizer:
    """Runs the loop for one task; every step's outcome is learned before the next."""

    def __init__(
        self,
        task: Task,
        start_source: str,
        *,
        provider: Provider | None,
        store: MemoryStore,
        config: LoopConfig,
        emit: Emit = lambda event: None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.task = task
        self.provider = provider
        self.store = store
        self.config = config
        self.emit = emit
        self.cancel = cancel or threading.Event()
        self.rng = random.Random(config.seed)
        self.local_selector: LocalSelector = (
            LLMLocalSelector(provider) if provider else EvidenceLocalSelector()
        )
        family = parsing.family(task.reference_source)
        self.episode = Episode(
            task.backend,
            family,
            task_signature(task.backend, family, task.name),
            config.policy,
            config.improve_margin,
        )
        self.result = RunResult(
            run_id=uuid.uuid4().hex[:12],
            task=task.name,
            backend=task.backend,
            provider=provider.name if provider else "offline",
            start_verdict=None,
            best_source=start_source,
        )
        self.tried: set[tuple[str, str]] = set()  # (strategy, code) pairs already evaluated
        # strategies that failed in this run (or, excluded, in earlier ones): not again
        self.start_source = start_source  # what the steps start from (the translation's)
        self.failed: dict[str, Status | str] = dict.fromkeys(config.exclude, EXCLUDED)

    # -- the loop -------------------------------------------------------------------

    def run(self) -> RunResult:
        standby.keep_warm(True)  # one candidate after another: each judge starts ahead
        try:
            return self._run()
        finally:
            standby.keep_warm(False)

    def _run(self) -> RunResult:
        try:
            start = self._translate() if not self.result.best_source else self._start()
        except RunStopped as stop:  # the translation's verdict said nothing about it
            self.result.stopped = str(stop)
            return self.result
        if start is None:
            return self.result
        self.result.start_verdict = start
        self.start_source = self.result.best_source
        self.result.best_correct = start.correct
        if start.note:
            self.result.note = CORRECTNESS_ONLY
        if usable_as_baseline(start):
            self.result.start_ref_speedup = self.result.best_ref_speedup = start.speedup
        for step in range(1, self.config.steps + 1):
            if self.cancel.is_set():
                self.result.stopped = "cancelled"
                break
            try:
                record = self._step(step)
            except LLMError as error:  # not the strategy's fault: learn nothing, stop
                self.result.stopped = f"LLM failed: {error}"
                break
            except RunStopped as stop:
                self.result.stopped = str(stop)
                break
            if record is None:
                self.result.stopped = "no applicable strategy"
                break
            self.result.steps.append(record)
            self.persist()
        self._duel_start()
        self.persist()
        return self.result

    def _step(self, step: int) -> Step | None:
        graph = self.store.graph(self.task.backend)
        current = self.result.best_source
        applicable = self._applicability(graph, current)
        usable = _restrict_to_applicable(graph, applicable)
        if not usable.globals:
            return None
        state = self._state(current)
        self._phase(step, "select")
        decision = self.episode.decide(usable, state, self.rng, self.local_selector, applicable)
        g, local_id = decision.global_id, decision.local_id
        self.tried.add((local_id, current))
        self._phase(step, "generate", g, local_id)
        made = self._implement(step, graph.locals[local_id], current, g, local_id)
        candidate, verdict = made.code, made.verdict
        versus_best: Duel | None = None
        if candidate is None or verdict is None:
            verdict = Verdict()  # no code: nothing was evaluated
            status, speedup_vs_best = Status.NO_CODE, None
        else:
            status, speedup_vs_best = self._status(verdict)
            if status == Status.IMPROVED and self.result.best_ref_speedup is not None:
                status, speedup_vs_best, versus_best = self._settle(step, candidate, g, local_id)
            if status == Status.IMPROVED:
                self.result.best_ref_speedup = verdict.speedup
                self.result.best_over_start = self.result.best_interval = None
                if versus_best and self.result.best_source == self.start_source:
                    self.result.best_over_start = versus_best.speedup
                    self.result.best_interval = versus_best.bounds
            if status == Status.IMPROVED or (verdict.correct and verdict.note):
                # an untimed run (Triton under its interpreter) goes on from correct code
                self.result.best_source, self.result.best_step = candidate, step
                self.result.best_correct = True
        self._phase(step, "update", g, local_id)
        r = self._learn(decision, status, verdict, speedup_vs_best, candidate)
        record = Step(
            step=step,
            global_id=g,
            local_id=local_id,
            reason=decision.local.reason,
            status=status,
            reward=r,
            speedup=self._over_start(verdict),
            decision=decision.global_decision.to_json(),
            local_decision=decision.local.to_json(),
            verdict=verdict,
            source=candidate or "",
            prompt_tokens=_input_tokens(made),
            note=made.note,
            llm=made.llm,
            versus_best=versus_best,
        )
        self.emit(record)
        return record

    def _start(self) -> Verdict | None:
        """The starting implementation's verdict; None when it cannot run at all."""
        start = self._measure(0, self.result.best_source)
        if start.error and start.unrunnable:
            self.result.start_verdict = start
            self.result.stopped = f"cannot run the starting implementation: {start.error.message}"
            if start.error.kind == ErrorKind.REFERENCE_ERROR:
                self.result.stopped = _stopped_by(start)
            return None
        return start

    def _translate(self) -> Verdict | None:
        """Step 0 of a task without an implementation (a KernelBench problem): the LLM
        writes a first ModelNew, measured like any candidate; None when it is not correct."""
        if self.provider is None:
            self.result.stopped = "nothing to start from and no LLM to write a first version"
            return None
        self._phase(0, "generate", START, TRANSLATE)
        prompt = translation_prompt(self.task.reference_source, self.task.backend)
        made = implement.with_llm(
            self.provider,
            prompt,
            self._measurer(0, START, TRANSLATE),
            task=self.task,
            local_text="a first, correct custom-kernel version of the reference",
            purpose="translate",
        )
        verdict = made.verdict
        status = self._status(verdict)[0] if verdict else Status.NO_CODE
        self.result.translation = Step(
            0, START, TRANSLATE, "no implementation to start from", status, 0.0, None,
            verdict=verdict or Verdict(), source=made.code or "",
            prompt_tokens=_input_tokens(made), note=made.note, llm=made.llm,
        )  # fmt: skip
        self.emit(self.result.translation)
        if made.code is None or verdict is None or not verdict.correct:
            why = made.note or (verdict.error.message if verdict and verdict.error else "")
            self.result.stopped = f"the translated first version is not correct: {status} {why}"
            return None
        self.result.best_source = made.code
        return verdict

    # -- pieces of a step -----------------------------------------------------------

    def _applicability(self, graph: Graph, source: str) -> dict[str, str | None]:
        """None for a runnable strategy, else the reason it cannot run now."""
        result: dict[str, str | None] = {}
        for local_id, node in graph.locals.items():
            if local_id in self.failed:
                why = self.failed[local_id]
                result[local_id] = why if why == EXCLUDED else f"failed earlier in this run ({why})"
            elif (local_id, source) in self.tried:
                result[local_id] = "already tried on the current code"
            elif node.mechanical:
                rewrite = REGISTRY.get(node.mechanical)
                result[local_id] = (
                    rewrite.check(source) if rewrite else f"unknown rewrite {node.mechanical}"
                )
            elif self.provider is None:
                result[local_id] = "needs an LLM (offline provider: mechanical strategies only)"
            else:
                result[local_id] = None
        return result

    def _state(self, source: str) -> State:
        return self.episode.state(
            parsing.features(source, self.task.backend),
            last_speedup=self.result.steps[-1].speedup if self.result.steps else None,
            best_speedup=self.result.best_speedup,
        )

    def _implement(
        self, step: int, node: LocalNode, current: str, g: str, local_id: str
    ) -> Implemented:
        measure = self._measurer(step, g, local_id)
        if node.mechanical:
            return implement.mechanical(node.mechanical, current, measure)
        assert self.provider is not None  # non-mechanical nodes are inapplicable offline
        prompt = generation_prompt(
            task_source=self.task.reference_source,
            current_code=current,
            feedback=self._feedback_text(),
            local_text=node.prompt_text(),
            positive_example=(
                node.evidence_positive[0].code_excerpt if node.evidence_positive else None
            ),
            negative_warnings=[e.note or e.code_excerpt for e in node.evidence_negative],
            language=implement.language_of(self.task)[0],
        )
        return implement.with_llm(
            self.provider,
            prompt,
            measure,
            task=self.task,
            local_text=node.prompt_text(),
            candidates=self.config.candidates,
        )

    def _measurer(self, step: int, g: str, local_id: str) -> implement.Measure:
        """`_measure` for this step; a verdict that says nothing about the strategy (no GPU,
        cancelled) stops the run instead."""

        def measure(code: str) -> Verdict:
            verdict = self._measure(step, code, g, local_id)
            if verdict.unrunnable:
                raise RunStopped(_stopped_by(verdict))
            return verdict

        return measure

    def _measure(self, step: int, source: str, g: str = "", local: str = "") -> Verdict:
        """A verdict fit to compare against: a cached verdict that is no baseline (suspect,
        recorded without the sandbox), a fresh suspect one and a fresh timing whose interval
        did not narrow are measured once more (the cache then holds the second one)."""
        verdict = self._evaluate(step, source, g, local)
        unsettled = not verdict.cached and verdict.runtime_ms is not None and not verdict.converged
        doubtful = verdict.suspect or (verdict.cached and not usable_as_baseline(verdict))
        if verdict.correct and (doubtful or unsettled):
            verdict = self._evaluate(step, source, g, local, use_cache=False)
        return verdict

    def _evaluate(
        self, step: int, source: str, g: str = "", local: str = "", use_cache: bool = True
    ) -> Verdict:
        def on_phase(phase: str) -> None:
            self._phase(step, phase, g, local)

        return evaluate(
            self.task,
            source,
            device=self.config.device,
            use_cache=use_cache and self.config.use_cache,
            cancel=self.cancel,
            on_phase=on_phase,
        )

    def _settle(
        self, step: int, candidate: str, g: str, local_id: str
    ) -> tuple[Status, float | None, Duel]:
        """An apparent win, timed in pairs against the best so far: improved only when the
        lower end of that interval clears the improve margin. A duel whose estimate clears
        the margin but whose interval does not is timed again in another run, up to
        MAX_DUELS runs in all, pooled (`pooled_interval`): most of a duel's interval is
        the spread between runs, which no run's own pairs narrow."""
        self._phase(step, "confirm", g, local_id)
        margin = self.config.improve_margin
        duels: list[Verdict] = []
        while True:
            duel = self._compare(candidate, self.result.best_source, run=len(duels))
            if not duel.correct or not duel.interval:
                # it passed once: the candidate or the incumbent is flaky; only deception
                # is the candidate's for certain
                kind = duel.error_kind
                cheated = kind == ErrorKind.CHEATING
                status = Status.CHEATING if cheated else Status.NOT_IMPROVED
                return status, None, Duel.failed(kind)
            duels.append(duel)
            pooled = pooled_interval(duels)
            ambiguous = pooled.low < margin <= pooled.estimate
            if not ambiguous or len(duels) == MAX_DUELS or self.cancel.is_set():
                break
        usable = all(usable_as_baseline(d) for d in duels)
        confirmed = pooled.low >= margin and usable
        summary = Duel.pooled(pooled, confirmed=confirmed, duels=len(duels))
        return Status.IMPROVED if confirmed else Status.NOT_IMPROVED, pooled.estimate, summary

    def _compare(self, candidate: str, incumbent: str, run: int = 0) -> Verdict:
        """The pair's `run`-th run timed together (each run is cached apart); a cached
        duel that is no baseline is timed again."""

        def duel(use_cache: bool) -> Verdict:
            device, cancel = self.config.device, self.cancel
            return compare(self.task, candidate, incumbent, device=device, cancel=cancel,
                           use_cache=use_cache, run=run)  # fmt: skip

        verdict = duel(self.config.use_cache)
        if verdict.cached and not usable_as_baseline(verdict):
            verdict = duel(use_cache=False)
        return verdict

    def _status(self, verdict: Verdict) -> tuple[Status, float | None]:
        """The outcome status and the speedup over the best so far (reference-normalised)."""
        kind = verdict.error_kind
        if not verdict.compiled:
            return (Status.TIMEOUT if kind == ErrorKind.TIMEOUT else Status.COMPILE_ERROR), None
        if not verdict.correct:
            return (FAILED_STATUS.get(kind, Status.INCORRECT) if kind else Status.INCORRECT), None
        if verdict.note:  # correct but not timed: nothing to compare
            return Status.NOT_IMPROVED, None
        best = self.result.best_ref_speedup
        ratio = verdict.speedup / best if best is not None and verdict.speedup else None
        if not usable_as_baseline(verdict):  # suspect even when re-timed: never a new best
            return Status.NOT_IMPROVED, ratio
        return self.episode.judge(ratio), ratio

    def _learn(
        self,
        decision: Decision,
        status: Status,
        verdict: Verdict,
        speedup: float | None,
        candidate: str | None,
    ) -> float:
        """One transaction in the memory; returns the step's reward."""
        outcome = self.episode.finish(
            decision,
            status,
            speedup=speedup,
            runtime_ms=verdict.runtime_ms,
            compiled=verdict.compiled,
            code_excerpt=_excerpt(candidate or ""),
        )
        self.store.apply_outcome(outcome)
        if status.info.penalty is not None:
            self.failed[decision.local_id] = status
        return outcome.reward

    def _over_start(self, verdict: Verdict) -> float | None:
        start, ref = self.result.start_ref_speedup, verdict.speedup
        if not verdict.correct or not start or not ref:
            return None
        return ref / start

    def _duel_start(self) -> None:
        """The run's claim over its start: the best, when it was not settled against the
        start itself, timed in pairs against it."""
        done = self.result.best_step == 0 or self.result.best_over_start is not None
        if done or self.result.best_ref_speedup is None or self.cancel.is_set():
            return
        self._phase(self.config.steps, "confirm")
        duel = self._compare(self.result.best_source, self.start_source)
        if duel.correct and duel.interval:
            self.result.best_over_start = duel.speedup
            self.result.best_interval = (duel.interval.low, duel.interval.high)

    def _feedback_text(self) -> str:
        if not self.result.steps:
            v = self.result.start_verdict or Verdict()
            light = roofline.describe(v.roofline)  # how far from the machine's limit
            return f"starting implementation: correct={v.correct}, {v.runtime_ms} ms" + (
                f", {light}" if light else ""
            )
        last = self.result.steps[-1]
        error = last.error.message if last.error else "none"
        light = roofline.describe(last.verdict.roofline)
        return (
            f"last step {last.global_id}/{last.local_id}: {last.status}; "
            f"speedup over start {last.speedup}{f', {light}' if light else ''}; error: {error}"
        )

    def _phase(self, step: int, phase: str, g: str = "", local: str = "") -> None:
        self.emit(Phase(step, self.config.steps, phase, g, local, time.time()))

    def persist(self) -> None:
        self.store.put(TRAJECTORIES, self.result.run_id, self.result.to_json())


def _stopped_by(verdict: Verdict) -> str:
    """Why a verdict stops the run: its kind, and for a failing reference what failed."""
    assert verdict.error is not None
    if verdict.error.kind == ErrorKind.REFERENCE_ERROR:
        return f"{ErrorKind.REFERENCE_ERROR.value}: {verdict.error.message}"
    return verdict.error.kind.value


def _restrict_to_applicable(graph: Graph, applicable: dict[str, str | None]) -> Graph:
    """The graph without directions that have no runnable strategy right now."""
    runnable = {lid: n for lid, n in graph.locals.items() if applicable.get(lid) is None}
    parents = {n.parent for n in runnable.values()}
    return Graph(
        backend=graph.backend,
        globals={gid: g for gid, g in graph.globals.items() if gid in parents},
        locals=runnable,
        edges=graph.edges,
    )


def _input_tokens(made: Implemented) -> int:
    return int(made.llm.get("usage", {}).get("input_tokens", 0))


def _excerpt(source: str, limit: int = 600) -> str:
    return source if len(source) <= limit else source[:limit] + "\n..."
