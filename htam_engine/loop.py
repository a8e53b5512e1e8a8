"""The T-step HTAM loop (design, "Data flow of one step").

state s_t -> global direction g_t (transition-aware) -> local strategy l_t -> candidate
c_{t+1} (mechanical rewrite or LLM) -> verdict (isolated worker) -> memory update.

`Optimizer` is the shell: `plan` makes a step's state and choice (`Episode`), the
implementation comes from `implement`, the `Referee` measures it and settles wins against
the run's incumbents, and the memory learns the outcome before the next step.
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
from htam_engine.episode import (
    IMPROVE_MARGIN,
    Decision,
    Episode,
    recorded_step_seconds,
    task_signature,
)
from htam_engine.errors import NoStartError
from htam_engine.evaluate import Duel, ErrorKind, Verdict, sizes, standby
from htam_engine.evaluate.runner import timing_threads
from htam_engine.events import Phase, PhaseClock, Step
from htam_engine.first_cpp import STRATEGY as FIRST_CPP
from htam_engine.first_cpp import write_first_cpp
from htam_engine.implement import Implemented, Measure
from htam_engine.llm import LLMError, Provider
from htam_engine.llm import facts as llm_facts
from htam_engine.llm.limits import BudgetExhausted
from htam_engine.machine import resolve_device
from htam_engine.memory import START, Graph, LocalNode, MemoryStore
from htam_engine.policy import (
    CONVERGED_AFTER,
    OTHER,
    STOP,
    EvidenceLocalSelector,
    LocalSelector,
    PolicyConfig,
    predicts_no_gain,
)
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.referee import Referee, Version
from htam_engine.runnable import LLM_FAILURES, Runnable, restrict
from htam_engine.state import State
from htam_engine.strategies.plateau import plateau_base
from htam_engine.task import Task
from htam_engine.triton_backend import CORRECTNESS_ONLY
from htam_engine.vocabulary import (
    BEHIND_REFERENCE,
    LARGE_OUTPUT,
    LARGE_OUTPUT_BYTES,
    NOTHING_APPLIES,
    OFFERS_USED_UP,
    Status,
)

Emit = Callable[[events.Event], None]
TRAJECTORIES = "trajectories"
TRANSLATE = "translate"  # the local id of step 0 when the LLM writes the first version
LLM_FAILED = "LLM failed: "  # how a step's note starts when the LLM gave no answer
NAMED_SPENT = "the memory expects nothing more of the named strategies on this task"


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
    # the best timed in pairs against the start (`Referee.over_start`), or its reference
    # ratio to the start's where that alone decides it
    over_start: Duel | None = None
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
        if self.over_start is not None and self.over_start.speedup is not None:
            return self.over_start.speedup
        if self.best_ref_speedup is None or not self.start_ref_speedup:
            return None
        return self.best_ref_speedup / self.start_ref_speedup

    @property
    def best_interval(self) -> tuple[float, float] | None:
        """The 95 % bounds of `best_speedup` where it was timed in pairs."""
        return self.over_start.bounds if self.over_start else None

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
            start_error=self.start_verdict.error if self.start_verdict else None,
        )


def _step_json(step: Step) -> dict[str, Any]:
    """A step as trajectories and `--json` keep it: the candidate is in the output folder."""
    data = events.to_json(step)
    del data["event"], data["source"]
    return data


@dataclass(frozen=True)
class Plan:
    """A step before its implementation: the code it starts from, the graph it chose in
    (all strategies) with each one's reason not to run, the state and the choice."""

    current: Version
    graph: Graph
    applicable: dict[str, str | None]
    state: State
    decision: Decision

    @property
    def node(self) -> LocalNode:
        return self.graph.locals[self.decision.local_id]


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
        self.task, self.provider, self.store, self.config = task, provider, store, config
        self.emit = emit
        self.cancel = cancel or threading.Event()
        self.rng = random.Random(config.seed)
        self.local_selector: LocalSelector = (
            LLMLocalSelector(provider) if provider else EvidenceLocalSelector()
        )
        family = parsing.family(task.reference_source)
        signature = task_signature(task.backend, family, task.name)
        self.episode = Episode(task.backend, family, signature, config.policy,
                               config.improve_margin)  # fmt: skip
        self.referee = Referee(task, device=config.device, use_cache=config.use_cache,
                               margin=config.improve_margin, judge=self.episode.judge,
                               cancel=self.cancel, on_phase=self._phase)  # fmt: skip
        self.referee.begin(Version(start_source))  # measured by `_start`
        self.run_id = uuid.uuid4().hex[:12]
        self.steps: list[Step] = []
        self.translation: Step | None = None  # step 0 when the LLM wrote the start
        self.stopped, self.note, self.output_dir = "completed", "", ""
        self.start_phases: dict[str, float] = {}
        self.closing_phases: dict[str, float] = {}
        self.runnable = Runnable.excluding(provider is not None, config.exclude)
        self.base: Version | None = None  # a plateau candidate the next step starts from
        self.clock = PhaseClock(recorded_step_seconds(store.items(TRAJECTORIES), task.name))
        self.sizing: sizes.Estimate | None = None  # the task's inputs and outputs

    # -- the loop -------------------------------------------------------------------

    def run(self) -> RunResult:
        standby.keep_warm(True)  # one candidate after another: each judge starts ahead
        try:
            self._run()
        except RunStopped as stop:  # the translation's verdict said nothing about it
            self.stopped = str(stop)
        finally:
            standby.keep_warm(False)
        return self.result()

    def _run(self) -> None:
        try:
            started = self._start() if self.referee.start.source else self._translate()
        finally:
            self.start_phases = self.clock.lap()
        if not started:
            return
        for number in range(1, self.config.steps + 1):
            if self.cancel.is_set():
                self.stopped = "cancelled"
                break
            try:
                record = self._step(number)
            except BudgetExhausted as error:  # the user's limit: stop
                self.stopped = f"{LLM_FAILED}{error}"
                break
            except RunStopped as stop:
                self.stopped = str(stop)
                break
            if record is None:
                self.stopped = NOTHING_APPLIES
                break
            self.steps.append(record)
            self.persist()
        if self.referee.close(self.config.steps):
            self.closing_phases = self.clock.lap(step=False)
        self.persist()

    def result(self) -> RunResult:
        """The run so far, as `--json`, the report and the trajectory store keep it."""
        start, best = self.referee.start, self.referee.best
        return RunResult(
            run_id=self.run_id,
            task=self.task.name,
            backend=self.task.backend,
            provider=self.provider.name if self.provider else "offline",
            start_verdict=start.verdict,
            steps=list(self.steps),
            best_source=best.source,
            best_step=best.step,
            translation=self.translation,
            best_correct=best.correct,
            note=self.note,
            best_ref_speedup=best.ref_speedup,
            start_ref_speedup=start.ref_speedup,
            over_start=self.referee.over_start,
            stopped=self.stopped,
            output_dir=self.output_dir,
            start_phases=self.start_phases,
            closing_phases=self.closing_phases,
        )

    def persist(self) -> None:
        self.store.put(TRAJECTORIES, self.run_id, self.result().to_json())

    def begin(self, start: Version) -> None:
        """The run stands on `start` (measured): its best until a step beats it."""
        self.referee.begin(start)
        if start.verdict is not None and start.verdict.note:
            self.note = CORRECTNESS_ONLY

    # -- one step -------------------------------------------------------------------

    def plan(self, number: int, current: Version | None = None) -> Plan | None:
        """Step `number`'s state and choice, from `current` (by default the best so far or
        a plateau base); None when no strategy can run."""
        if current is None:
            current, self.base = self.base or self.referee.best, None
        graph = self.store.graph(self.task.backend)
        state = self._state(current)
        applicable, usable = self._offers(graph, state, current.source)
        if not usable.globals:
            return None
        if "near_limit" in state.features:  # at 90 % or more of the machine's limit
            placed = (current.verdict or Verdict()).roofline
            raise RunStopped(f"at the limit: {roofline.describe(placed)}")
        self._phase(number, "select")
        chosen = self.episode.choose_global(usable, state, self.rng)
        # mechanical steps cost no LLM call: offline, the run goes on while a strategy fits;
        # with a model, the memory's "nothing more" withholds only the named strategies
        if self.provider is not None and predicts_no_gain(chosen, state):
            spent = self._own_ideas_spent(graph)
            if not spent:
                applicable, usable = self._offers(graph, state, current.source, own_only=True)
            if spent or not usable.globals:
                raise RunStopped("converged")
            chosen = self.episode.choose_global(usable, state, self.rng)
        decision = self.episode.decide(
            usable, state, self.rng, self.local_selector, applicable, chosen=chosen
        )
        return Plan(current, graph, applicable, state, decision)

    def _offers(
        self, graph: Graph, state: State, source: str, *, own_only: bool = False
    ) -> tuple[dict[str, str | None], Graph]:
        """Why each strategy cannot run now (None: it can), and the graph of those that
        can; the model's own strategy where nothing named is left, or `own_only`."""
        applicable = self.runnable.of(graph, state, source)
        usable = restrict(graph, applicable)
        if own_only or not usable.globals:
            state.features.add(OFFERS_USED_UP)
            applicable = self.runnable.of(graph, state, source)
            if own_only:
                applicable = {
                    lid: why or (None if graph.locals[lid].open_ended else NAMED_SPENT)
                    for lid, why in applicable.items()
                }
            usable = restrict(graph, applicable)
        return applicable, usable

    def _step(self, number: int) -> Step | None:
        plan = self.plan(number)
        while plan is not None and plan.decision.local_id == OTHER:  # none of it fit
            self.runnable.set_aside.add((plan.decision.global_id, plan.current.source))
            plan = self.plan(number, plan.current)
        if plan is None:
            return None
        decision, g, local_id = plan.decision, plan.decision.global_id, plan.decision.local_id
        if local_id == STOP:
            raise RunStopped(f"stop: {decision.local.reason}")
        self.runnable.tried.add((local_id, plan.current.source))
        self._phase(number, "generate", g, local_id)
        made = self._implement_or_fail(number, plan)
        status, speedup, versus_best = self._conclude(number, plan, made)
        self._phase(number, "update", g, local_id)
        # an LLM that did not answer says nothing about the strategy: nothing is learned
        llm_down = made.note.startswith(LLM_FAILED)
        verdict = made.verdict if made.code is not None and made.verdict else Verdict()
        # a number the load disturbed is evidence only where paired duels settled it
        evidence = speedup if versus_best is not None or not verdict.noisy else None
        reward = 0.0 if llm_down else self.learn(decision, status, verdict, evidence,
                                                 made.code, made.note)  # fmt: skip
        record = Step(
            step=number,
            global_id=g,
            local_id=local_id,
            reason=decision.local.reason,
            status=status,
            reward=reward,
            speedup=self.referee.estimate_over_start(verdict),
            decision=decision.global_decision,
            local_decision=decision.local,
            verdict=verdict,
            source=made.code or "",
            prompt_tokens=_input_tokens(made),
            note=made.note,
            llm=made.llm,
            versus_best=versus_best,
            phases=self.clock.lap(),
        )
        self.emit(record)
        return record

    def _conclude(
        self, number: int, plan: Plan, made: Implemented
    ) -> tuple[Status, float | None, Duel | None]:
        """The candidate's status, speedup over the best and duel; a win becomes the best,
        a tie an edge predicts a follow-up gain from becomes the next step's base."""
        if made.code is None or made.verdict is None:
            return Status.NO_CODE, None, None  # no code: nothing was evaluated
        candidate = Version(made.code, number, made.verdict)
        g, local_id = plan.decision.global_id, plan.decision.local_id
        status, speedup, duel = self.referee.decide(candidate, g, local_id)
        if status == Status.NOT_IMPROVED and plateau_base(plan.graph, g, duel):
            self.base = candidate  # the best stays; the next step starts here
        # an untimed run (Triton under its interpreter) goes on from correct code
        if status == Status.IMPROVED or (candidate.correct and made.verdict.note):
            self.referee.promote(candidate, duel)
        return status, speedup, duel

    def _start(self) -> bool:
        """Measure the starting implementation; False when it cannot run at all."""
        source = self.referee.start.source
        start = self.referee.measure(0, source)
        self.begin(Version(source, 0, start))
        if start.error and start.error.kind == ErrorKind.COMPILE_ERROR:  # nothing to step from
            self.stopped = f"your kernel does not compile: {start.error.message}"
            return False
        if start.error and start.unrunnable:
            self.stopped = f"cannot run the starting implementation: {start.error.message}"
            if start.error.kind == ErrorKind.REFERENCE_ERROR:
                self.stopped = _stopped_by(start)
            return False
        return True

    def _translate(self) -> bool:
        """Step 0 of a task without an implementation (a KernelBench problem): the LLM
        writes a first ModelNew (without one, htam writes naive C++ from the reference),
        measured like any candidate; False when it is not correct."""
        self._phase(0, "generate", START, TRANSLATE)
        measure = self._measurer(0, START, TRANSLATE)
        reason = "" if self.provider else f": {FIRST_CPP}"
        if self.provider is None:
            made = self._first_cpp(measure)
            if made is None:
                return False
        else:
            made = implement.first_version(self.provider, self.task, self._facts(), measure)
        verdict = made.verdict
        status = self.referee.status(verdict)[0] if verdict else Status.NO_CODE
        self.translation = Step(
            0, START, TRANSLATE, f"no implementation to start from{reason}", status, 0.0, None,
            verdict=verdict or Verdict(), source=made.code or "",
            prompt_tokens=_input_tokens(made), note=made.note, llm=made.llm,
        )  # fmt: skip
        self.emit(self.translation)
        if made.code is None or verdict is None or not verdict.correct:
            why = made.note or (verdict.error.message if verdict and verdict.error else "")
            self.stopped = f"the translated first version is not correct: {status} {why}"
            return False
        self.begin(Version(made.code, 0, verdict))
        return True

    def _first_cpp(self, measure: Measure) -> Implemented | None:
        """Without an LLM: the reference written mechanically as naive C++, measured;
        None (the run stopped `no_start: ...`) when htam cannot write one of its ops."""
        try:
            if resolve_device(self.config.device, "cpu") != "cpu":
                raise NoStartError(
                    f"{self.task.name}: {FIRST_CPP} runs on the CPU, not on "
                    f"--device {self.config.device}; use an LLM provider"
                )
            code = write_first_cpp(self.task.reference_path)
        except NoStartError as error:
            self.stopped = f"{NoStartError.kind}: {error}"
            return None
        return Implemented(code, measure(code))

    # -- pieces of a step -----------------------------------------------------------

    def applicability(self, graph: Graph, current: Version) -> dict[str, str | None]:
        """None for a strategy that can run on `current` now, else the reason it cannot."""
        return self.runnable.of(graph, self._state(current), current.source)

    def _own_ideas_spent(self, graph: Graph) -> bool:
        """The model's own strategy wrote each of the last `CONVERGED_AFTER` steps, and
        none was kept: its ideas, too, have stopped paying."""
        recent = self.steps[-CONVERGED_AFTER:]
        return len(recent) == CONVERGED_AFTER and all(
            step.local_id in graph.locals and graph.locals[step.local_id].open_ended
            and step.status != Status.IMPROVED
            for step in recent
        )  # fmt: skip

    def _state(self, current: Version) -> State:
        verdict = current.verdict or Verdict()
        light = roofline.tags(verdict.roofline)  # memory_bound, near_limit
        features = parsing.features(current.source, self.task.backend) | set(light)
        if verdict.interval and verdict.interval.high < 1.0:  # PyTorch, confirmed faster
            features.add(BEHIND_REFERENCE)
        if (self._sizing().outputs or 0) >= LARGE_OUTPUT_BYTES:
            features.add(LARGE_OUTPUT)
        if "loop vectorized" in verdict.vectorizer:  # GCC did, though no SIMD is written
            features.discard("no_simd")
        state = self.episode.state(
            features,
            last_speedup=self.steps[-1].speedup if self.steps else None,
            best_speedup=self.result().best_speedup,
        )
        state.threads = timing_threads()
        state.report = llm_facts.attempts_text(self.steps[-3:])
        state.facts, state.code = self._times(current), current.source  # for a chooser
        return state

    def _implement_or_fail(self, number: int, plan: Plan) -> Implemented:
        """`implement`; an LLM that fails (a deadline, a refusal) fails this step only
        (`no_code` with the reason); after `LLM_FAILURES` in a row the run goes on with
        mechanical strategies and says so."""
        try:
            made = self.implement(number, plan)
        except BudgetExhausted:
            raise
        except LLMError as error:
            self.runnable.llm_failures += 1
            note = f"{LLM_FAILED}{error}"
            if self.runnable.llm_given_up:
                note += f"; {LLM_FAILURES} failures in a row: mechanical strategies from now on"
                self.local_selector = EvidenceLocalSelector()
                self.note = self.note or note
            return Implemented(None, None, note)
        if made.llm:  # the model answered
            self.runnable.llm_failures = 0
        return made

    def implement(self, number: int, plan: Plan) -> Implemented:
        """Step `number`'s candidate by the planned strategy, measured."""
        node, current = plan.node, plan.current.source
        measure = self._measurer(number, plan.decision.global_id, node.id)
        if node.mechanical and self.runnable.rewrites(node, current):
            return implement.mechanical(node.mechanical, current, measure)
        assert self.provider is not None  # the rest are inapplicable offline
        family = self.episode.family
        facts_text = self._facts(plan.current)
        prompt = implement.next_version_prompt(self.task, node, family=family,
                                               signature=self.episode.signature,
                                               current=current, steps=self.steps,
                                               facts_text=facts_text,
                                               reason=plan.decision.local.reason)  # fmt: skip
        return implement.with_llm(self.provider, prompt, measure, task=self.task,
                                  local_text=node.prompt_text(family),
                                  candidates=self.config.candidates,
                                  facts_text=facts_text)  # fmt: skip

    def _facts(self, current: Version | None = None) -> str:
        """The prompt's facts; `current`, the version the step starts from."""
        shown = _tie_shown(current, self.referee.best)
        shapes = self._sizing().shapes
        return implement.facts(self.task, *self._incumbents(), shapes=shapes, shown=shown,
                               code=current.verdict if current else None)  # fmt: skip

    def _sizing(self) -> sizes.Estimate:
        """The judge's sizing of the task, kept by content: asked once a run."""
        if self.sizing is None:
            self.sizing = sizes.estimate(self.task, self.config.device)
        return self.sizing

    def _times(self, current: Version) -> str:
        return llm_facts.times_text(*self._incumbents(), _tie_shown(current, self.referee.best))

    def _incumbents(self) -> tuple[Verdict | None, Verdict | None, int]:
        """The start's verdict, the best's (None while it is the start) and its step."""
        start, best = self.referee.start, self.referee.best
        return start.verdict, best.verdict if best.step else None, best.step

    def _measurer(self, number: int, g: str, local_id: str) -> Measure:
        """`Referee.measure` for this step; a verdict that says nothing about the strategy
        (no GPU, cancelled) stops the run instead."""

        def measure(code: str) -> Verdict:
            verdict = self.referee.measure(number, code, g, local_id)
            if verdict.unrunnable:
                raise RunStopped(_stopped_by(verdict))
            return verdict

        return measure

    def learn(
        self,
        decision: Decision,
        status: Status,
        verdict: Verdict,
        speedup: float | None,
        candidate: str | None,
        note: str = "",
    ) -> float:
        """One transaction in the memory; returns the step's reward. A strategy that
        failed is not chosen again in this run."""
        outcome = self.episode.finish(decision, status, speedup=speedup,
                                      runtime_ms=verdict.runtime_ms, compiled=verdict.compiled,
                                      code_excerpt=candidate or "")  # fmt: skip
        outcome.note = note or llm_facts.failure_note(verdict)
        self.store.apply_outcome(outcome)
        if status.info.penalty is not None:
            self.runnable.failed[decision.local_id] = status
        return outcome.reward

    def _phase(self, number: int, phase: str, g: str = "", local: str = "") -> None:
        self.clock.enter(phase)
        left = self.clock.left_s(self.config.steps - number + 1)
        self.emit(Phase(number, self.config.steps, phase, g, local, time.time(), left))


def _tie_shown(current: Version | None, best: Version) -> int | None:
    """The step of `current` where a step starts from it rather than from the best."""
    return None if current is None or current.source == best.source else current.step


def _stopped_by(verdict: Verdict) -> str:
    """Why a verdict stops the run: its kind, and for a failing reference or judge what
    failed (a run ended "evaluator_error" and nothing said why)."""
    assert verdict.error is not None
    if verdict.error.kind in (ErrorKind.REFERENCE_ERROR, ErrorKind.EVALUATOR_ERROR):
        return f"{verdict.error.kind.value}: {verdict.error.message}"
    return verdict.error.kind.value


def _input_tokens(made: Implemented) -> int:
    return int(made.llm.get("usage", {}).get("input_tokens", 0))
