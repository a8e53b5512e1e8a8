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

from htam_engine import events, implement, parsing, roofline, stats
from htam_engine.episode import (
    IMPROVE_MARGIN,
    Decision,
    Episode,
    recorded_step_seconds,
    task_signature,
)
from htam_engine.evaluate import Duel, ErrorKind, Verdict, evaluate, standby
from htam_engine.evaluate.cache import usable_as_baseline
from htam_engine.evaluate.runner import compare, pooled_interval, timing_threads
from htam_engine.events import Phase, PhaseClock, Step
from htam_engine.implement import Implemented
from htam_engine.llm import LLMError, Provider, generation_prompt, translation_prompt
from htam_engine.llm import facts as llm_facts
from htam_engine.llm.limits import BudgetExhausted
from htam_engine.memory import START, Graph, LocalNode, MemoryStore
from htam_engine.policy import (
    STOP,
    EvidenceLocalSelector,
    LocalSelector,
    PolicyConfig,
    predicts_no_gain,
    unfit,
)
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import State
from htam_engine.strategies import REGISTRY
from htam_engine.strategies.plateau import plateau_base
from htam_engine.task import Task
from htam_engine.triton_backend import CORRECTNESS_ONLY
from htam_engine.vocabulary import FAILED_STATUS, Status

Emit = Callable[[events.Event], None]
TRAJECTORIES = "trajectories"
MAX_DUELS = 3  # runs of one ambiguous duel, pooled, before a win is given up
TRANSLATE = "translate"  # the local id of step 0 when the LLM writes the first version
EXCLUDED = "excluded: it failed on this task in an earlier run"
LLM_FAILURES = 2  # consecutive failed LLM generations before the run goes mechanical
LLM_FAILED = "LLM failed: "  # how a step's note starts when the LLM gave no answer


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
    # the best timed in pairs against the start (`Optimizer._duel_start`), or its
    # reference ratio to the start's where that alone decides it: the estimate and its
    # 95 % bounds
    best_over_start: float | None = None
    best_interval: tuple[float, float] | None = None
    stopped: str = "completed"
    output_dir: str = ""
    start_phases: dict[str, float] = field(default_factory=dict)  # measuring the start
    closing_phases: dict[str, float] = field(default_factory=dict)  # the best vs the start

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
            "start_phases": self.start_phases,
            "closing_phases": self.closing_phases,
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
        self.base: str | None = None  # a plateau candidate the next step starts from
        self.llm_failures = 0  # consecutive generations the LLM did not answer
        self.best_verdict: Verdict | None = None  # the best's own timing, once usable
        self.clock = PhaseClock(recorded_step_seconds(store.items(TRAJECTORIES), task.name))

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
        finally:
            self.result.start_phases = self.clock.lap()
        if start is None:
            return self.result
        self.result.start_verdict = start
        self.start_source = self.result.best_source
        self.result.best_correct = start.correct
        if start.note:
            self.result.note = CORRECTNESS_ONLY
        if usable_as_baseline(start):
            self.result.start_ref_speedup = self.result.best_ref_speedup = start.speedup
            self.best_verdict = start
        for step in range(1, self.config.steps + 1):
            if self.cancel.is_set():
                self.result.stopped = "cancelled"
                break
            try:
                record = self._step(step)
            except BudgetExhausted as error:  # the user's limit: stop
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
        current, self.base = self.base or self.result.best_source, None
        applicable = self._applicability(graph, current)
        usable = _restrict_to_applicable(graph, applicable)
        if not usable.globals:
            return None
        state = self._state(current)
        if "near_limit" in state.features:  # at 90 % or more of the machine's limit
            raise RunStopped(
                f"at the limit: {roofline.describe(self._verdict_of(current).roofline)}"
            )
        self._phase(step, "select")
        decision = self.episode.decide(usable, state, self.rng, self.local_selector, applicable)
        g, local_id = decision.global_id, decision.local_id
        if local_id == STOP:
            raise RunStopped(f"stop: {decision.local.reason}")
        if predicts_no_gain(decision.global_decision, state):
            raise RunStopped("converged")
        self.tried.add((local_id, current))
        self._phase(step, "generate", g, local_id)
        made = self._implement_or_fail(step, graph.locals[local_id], current, g, local_id)
        candidate, verdict = made.code, made.verdict
        versus_best: Duel | None = None
        if candidate is None or verdict is None:
            verdict = Verdict()  # no code: nothing was evaluated
            status, speedup_vs_best = Status.NO_CODE, None
        else:
            status, speedup_vs_best = self._status(verdict)
            if status == Status.IMPROVED and self.result.best_ref_speedup is not None:
                status, speedup_vs_best, versus_best = self._settle(
                    step, candidate, g, local_id, verdict
                )
                if status == Status.NOT_IMPROVED and plateau_base(graph, g, versus_best):
                    self.base = candidate  # the best stays; the next step starts here
            if status == Status.IMPROVED:
                self.result.best_ref_speedup, self.best_verdict = verdict.speedup, verdict
                self.result.best_over_start = self.result.best_interval = None
                if versus_best and self.result.best_source == self.start_source:
                    self.result.best_over_start = versus_best.speedup
                    self.result.best_interval = versus_best.bounds
            if status == Status.IMPROVED or (verdict.correct and verdict.note):
                # an untimed run (Triton under its interpreter) goes on from correct code
                self.result.best_source, self.result.best_step = candidate, step
                self.result.best_correct = True
        self._phase(step, "update", g, local_id)
        # an LLM that did not answer says nothing about the strategy: nothing is learned
        llm_down = made.note.startswith(LLM_FAILED)
        r = 0.0 if llm_down else self._learn(decision, status, verdict, speedup_vs_best,
                                             candidate, made.note)  # fmt: skip
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
            phases=self.clock.lap(),
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
        prompt = translation_prompt(self.task.reference_source, self.task.backend, self._facts())
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
        state = self._state(source)
        for local_id, node in graph.locals.items():
            if why_not := unfit(node, state):
                result[local_id] = f"does not fit: {why_not}"
            elif local_id in self.failed:
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
            elif self.llm_failures >= LLM_FAILURES:
                result[local_id] = f"needs an LLM (it failed {LLM_FAILURES} times in a row)"
            else:
                result[local_id] = None
        return result

    def _verdict_of(self, source: str) -> Verdict:
        """The timing of `source` when it is the best or the start ({} roofline otherwise)."""
        if source == self.result.best_source and self.best_verdict is not None:
            return self.best_verdict
        if source == self.start_source and self.result.start_verdict is not None:
            return self.result.start_verdict
        return Verdict()

    def _state(self, source: str) -> State:
        light = roofline.tags(self._verdict_of(source).roofline)  # memory_bound, near_limit
        state = self.episode.state(
            parsing.features(source, self.task.backend) | set(light),
            last_speedup=self.result.steps[-1].speedup if self.result.steps else None,
            best_speedup=self.result.best_speedup,
        )
        state.threads = timing_threads()
        state.report = llm_facts.attempts_text(self.result.steps[-3:])
        return state

    def _implement_or_fail(
        self, step: int, node: LocalNode, current: str, g: str, local_id: str
    ) -> Implemented:
        """`_implement`; an LLM that fails (a deadline, a refusal) fails this step only
        (`no_code` with the reason); after `LLM_FAILURES` in a row the run goes on with
        mechanical strategies and says so."""
        try:
            made = self._implement(step, node, current, g, local_id)
        except BudgetExhausted:
            raise
        except LLMError as error:
            self.llm_failures += 1
            note = f"{LLM_FAILED}{error}"
            if self.llm_failures >= LLM_FAILURES:
                note += f"; {LLM_FAILURES} failures in a row: mechanical strategies from now on"
                self.local_selector = EvidenceLocalSelector()
                self.result.note = self.result.note or note
            return Implemented(None, None, note)
        if not node.mechanical:
            self.llm_failures = 0
        return made

    def _implement(
        self, step: int, node: LocalNode, current: str, g: str, local_id: str
    ) -> Implemented:
        measure = self._measurer(step, g, local_id)
        if node.mechanical:
            return implement.mechanical(node.mechanical, current, measure)
        assert self.provider is not None  # non-mechanical nodes are inapplicable offline
        family = self.episode.family
        example = node.example(family)
        prompt = generation_prompt(
            task_source=self.task.reference_source,
            current_code=current,
            feedback=llm_facts.attempts_text(self.result.steps),
            local_text=node.prompt_text(family),
            positive_example=example.code_excerpt if example else None,
            negative_warnings=[
                f"{e.status} on {e.task_signature}: {e.note}"
                for e in node.evidence_negative
                if e.note and e.task_signature != self.episode.signature  # this run's: above
            ],
            language=implement.language_of(self.task)[0],
            facts=self._facts(),
        )
        return implement.with_llm(
            self.provider,
            prompt,
            measure,
            task=self.task,
            local_text=node.prompt_text(family),
            candidates=self.config.candidates,
        )

    def _facts(self) -> str:
        best = next((s for s in self.result.steps if s.step == self.result.best_step), None)
        return llm_facts.facts_block(
            backend=self.task.backend,
            threads=timing_threads(),
            reference=self.task.reference_source,
            allowed=self.task.allow_torch,
            start=self.result.start_verdict,
            best=best.verdict if best else None,
            best_step=self.result.best_step,
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

        best = self.result.best_ref_speedup  # the question: does it clear the best?
        return evaluate(
            self.task,
            source,
            device=self.config.device,
            use_cache=use_cache and self.config.use_cache,
            cancel=self.cancel,
            on_phase=on_phase,
            decide=best * self.config.improve_margin if best else None,
        )

    def _settle(
        self, step: int, candidate: str, g: str, local_id: str, verdict: Verdict | None = None
    ) -> tuple[Status, float | None, Duel]:
        """An apparent win, timed in pairs against the best so far unless the reference
        ratios already decide it (`_by_ratios`): improved only when the
        lower end of that interval clears the improve margin. A duel whose estimate clears
        the margin but whose interval does not is timed again in another run, up to
        MAX_DUELS runs in all, pooled (`pooled_interval`): most of a duel's interval is
        the spread between runs, which no run's own pairs narrow."""
        margin = self.config.improve_margin
        decided = self._by_ratios(verdict, self.best_verdict) if verdict else None
        if decided is not None:
            return Status.IMPROVED, decided.speedup, decided
        self._phase(step, "confirm", g, local_id)
        duels: list[Verdict] = []
        while True:
            duel = self._compare(candidate, self.result.best_source, run=len(duels), decide=margin)
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

    def _by_ratios(self, verdict: Verdict, best: Verdict | None) -> Duel | None:
        """`verdict` over `best` from their own intervals over the reference (each widened
        by the run-to-run spread), when that alone puts it above the improve margin: a
        duel could only confirm it (None: not decided, no usable timing, or either one
        noisy: a busy machine drifts between runs beyond the spread allowed for)."""
        if best is None or not (usable_as_baseline(verdict) and usable_as_baseline(best)):
            return None
        if verdict.noisy or best.noisy:
            return None
        if verdict.interval is None or best.interval is None:
            return None
        over = stats.ratio(verdict.interval, best.interval)
        if stats.side(over, self.config.improve_margin) <= 0:
            return None
        return Duel.pooled(over, confirmed=True, duels=0)

    def _compare(
        self, candidate: str, incumbent: str, run: int = 0, decide: float | None = None
    ) -> Verdict:
        """The pair's `run`-th run timed together (each run is cached apart); a cached
        duel that is no baseline is timed again."""

        def duel(use_cache: bool) -> Verdict:
            device, cancel = self.config.device, self.cancel
            return compare(self.task, candidate, incumbent, device=device, cancel=cancel,
                           use_cache=use_cache, run=run, decide=decide)  # fmt: skip

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
        note: str = "",
    ) -> float:
        """One transaction in the memory; returns the step's reward."""
        outcome = self.episode.finish(
            decision,
            status,
            speedup=speedup,
            runtime_ms=verdict.runtime_ms,
            compiled=verdict.compiled,
            code_excerpt=candidate or "",
        )
        outcome.note = note or llm_facts.failure_note(verdict)
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
        if (decided := self._by_ratios_over_start()) is not None:  # no need to re-time it
            self.result.best_over_start, self.result.best_interval = decided
            return
        self._phase(self.config.steps, "confirm")
        duel = self._compare(self.result.best_source, self.start_source)
        if duel.correct and duel.interval:
            self.result.best_over_start = duel.speedup
            self.result.best_interval = (duel.interval.low, duel.interval.high)
        self.result.closing_phases = self.clock.lap(step=False)

    def _by_ratios_over_start(self) -> tuple[float, tuple[float, float]] | None:
        start = self.result.start_verdict
        decided = self._by_ratios(self.best_verdict, start) if self.best_verdict else None
        if decided is None or decided.speedup is None or decided.bounds is None:
            return None
        return decided.speedup, decided.bounds

    def _phase(self, step: int, phase: str, g: str = "", local: str = "") -> None:
        self.clock.enter(phase)
        left = self.clock.left_s(self.config.steps - step + 1)
        self.emit(Phase(step, self.config.steps, phase, g, local, time.time(), left))

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
