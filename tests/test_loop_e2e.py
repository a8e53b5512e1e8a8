"""`htam optimize` end to end on the CPU: real compiles, real verdicts, real memory updates.

Three runs: offline (mechanical strategies only); an OpenAI-compatible run against the
local API server of the tests, recorded to a cassette; and a replay of that cassette,
which must take the same decisions.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.hermetic import environment_in, second_home
from helpers.llm_api_server import Reply, Request, ScriptedAPIServer
from helpers.skips import require

from htam_engine.evaluate.cache import usable_as_baseline
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Verdict
from htam_engine.events import Event, Phase
from htam_engine.memory import load_seed

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LLM_ANSWER = Path(__file__).parent / "fixtures" / "loop" / "softmax_llm_answer.py"
CPU_GRAPH = load_seed("cpu")


@pytest.fixture
def task(tmp_path: Path) -> Path:
    folder = tmp_path / "softmax"
    shutil.copytree(ROOT / "examples" / "softmax", folder)
    return folder / "cpu_naive.py"


def htam(home: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=environment_in(home, **(env or {})),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def attempts(home: Path) -> dict[str, int]:
    memory = htam(home, "memory", "show", "--backend", "cpu", "--json")
    return {n["id"]: n["stats"]["attempts"] for n in memory["local_nodes"]}


def test_offline_run_learns_from_real_outcomes(task: Path, tmp_path: Path, htam_home: Path) -> None:
    home = htam_home
    result = htam(
        home,
        "optimize",
        str(task),
        "--provider",
        "offline",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--json",
        "--output",
        str(tmp_path / "out"),
    )
    assert result["correct"] is True
    assert result["steps"], result["stopped"]
    for step in result["steps"]:
        assert CPU_GRAPH.locals[step["local"]].mechanical, "offline must use mechanical rewrites"
        assert step["verdict"]["compiled"] is True
    learned = attempts(home)
    for step in result["steps"]:
        assert learned[step["local"]] >= 1
    assert sum(learned.values()) == len(result["steps"])
    # a win is one only when paired timing against the best says so; with no usable best
    # (the start's timing was suspect or disturbed) the first correct step needs no duel
    start = Verdict.from_json(result["start_verdict"])
    improved_before = False
    for step in result["steps"]:
        duel = step["versus_best"]
        if step["status"] == "improved" and duel:
            assert duel["confirmed"] and duel["low"] >= 1.02, duel
        elif step["status"] == "improved":
            assert not improved_before and not usable_as_baseline(start), step
        elif duel:
            assert not duel.get("confirmed"), duel
        improved_before = improved_before or step["status"] == "improved"
    if result["best_step"]:
        low, high = result["best_interval"]
        assert low <= result["best_speedup"] <= high
    out = Path(result["output_dir"])
    steps_table, phases = (out / "report.md").read_text().split("## Where the time went")
    assert steps_table.count("\n| ") == len(result["steps"]) + 2  # header, rule, one row a step
    rows = phases.count("\n| ") - 3  # less header, rule and the start's row
    assert rows - len(result["steps"]) in (0, 1)  # one a step, and the closing duel's if any
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    assert "ModelNew" in (out / "best.py").read_text()


class KernelEngineerServer(ScriptedAPIServer):
    """Answers local-selection prompts with a strategy that needs an LLM, and generation
    prompts with a real, better softmax implementation."""

    def _next(self, request: Request) -> Reply:
        prompt = request.body["messages"][-1]["content"]
        if '{"local"' in prompt:
            offered = [line[4:].strip() for line in prompt.splitlines() if line.startswith("### ")]
            llm_only = [
                i for i in offered if i in CPU_GRAPH.locals and not CPU_GRAPH.locals[i].mechanical
            ]
            choice = (llm_only or offered)[0]
            return Reply(text=f'Sure. {{"local": "{choice}", "reason": "fuse the passes"}} Done.')
        return Reply(text=f"Here it is:\n```python\n{LLM_ANSWER.read_text()}```\nEnjoy.")


def test_llm_run_records_and_replays(task: Path, tmp_path: Path, htam_home: Path) -> None:
    # A duel cached outside the sandbox is never a baseline (a candidate could have written
    # it), so without bwrap the replay times its duels afresh and cannot retrace the run.
    require(None if sandbox_mode() == "bwrap" else "no bubblewrap sandbox starts here")
    home, cassette = htam_home, tmp_path / "run.jsonl"
    common = ["--device", "cpu", "--steps", "2", "--seed", "7", "--json"]
    with KernelEngineerServer() as server:
        recorded = htam(
            home,
            "optimize",
            str(task),
            "--provider",
            "openai",
            "--base-url",
            f"{server.url}/v1",
            "--record",
            str(cassette),
            "--output",
            str(tmp_path / "rec"),
            *common,
            env={"OPENAI_API_KEY": "sk-test-secret-key"},
        )
    assert recorded["correct"] is True
    assert "sk-test-secret-key" not in cassette.read_text()
    generated = [s for s in recorded["steps"] if not CPU_GRAPH.locals[s["local"]].mechanical]
    assert generated, "the LLM chose no LLM-written strategy"
    assert all(s["verdict"]["correct"] for s in generated)
    for step in recorded["steps"]:
        assert attempts(home)[step["local"]] >= 1

    # A fresh memory with the recorded verdicts cached: the same seed must retrace the run.
    replay_home = second_home(htam_home, "replay-home")
    shutil.copytree(home / "eval-cache", replay_home / "eval-cache")
    replayed = htam(
        replay_home,
        "optimize",
        str(task),
        "--provider",
        "replay",
        "--cassette",
        str(cassette),
        "--output",
        str(tmp_path / "rep"),
        *common,
    )

    def trace(run: dict) -> list[tuple]:  # a re-timed duel's runs are cached one by one
        return [(s["global"], s["local"], s["status"], s["versus_best"]) for s in run["steps"]]

    assert trace(replayed) == trace(recorded)
    assert all(s["verdict"]["cached"] for s in replayed["steps"])
    assert attempts(replay_home) == attempts(home)


def test_cancel_mid_step_learns_nothing(task: Path, tmp_path: Path) -> None:
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.task import load_task

    cancel = threading.Event()

    def emit(event: Event) -> None:
        if isinstance(event, Phase) and event.step == 1 and event.phase == "verify":
            cancel.set()  # the candidate is being evaluated in its worker now

    loaded = load_task(task)
    store = MemoryStore(tmp_path / "home")
    optimizer = Optimizer(
        loaded,
        loaded.impl_source or "",
        provider=None,
        store=store,
        config=LoopConfig(steps=3, device="cpu"),
        emit=emit,
        cancel=cancel,
    )
    result = optimizer.run()
    assert result.stopped == "cancelled"
    assert result.steps == []
    graph = store.graph("cpu")
    assert sum(node.stats.attempts for node in graph.locals.values()) == 0


def test_a_strategy_that_failed_is_not_tried_again_in_the_run(task: Path, tmp_path: Path) -> None:
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.referee import Version
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    loaded = load_task(task)
    store = MemoryStore(tmp_path / "home")
    source = loaded.impl_source or ""
    optimizer = Optimizer(
        loaded, source, provider=None, store=store, config=LoopConfig(steps=1, device="cpu")
    )
    plan = optimizer.plan(1)
    assert plan is not None
    decision = plan.decision
    assert plan.applicable[decision.local_id] is None

    optimizer.learn(decision, Status.COMPILE_ERROR, Verdict(), None, source)
    later = optimizer.applicability(plan.graph, Version(source + "\n// another version\n"))
    assert later[decision.local_id] == "failed earlier in this run (compile_error)"


def test_a_suspect_speedup_never_becomes_the_best_nor_evidence(task: Path, tmp_path: Path) -> None:
    from htam_engine.evaluate import EvalError
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.referee import Version
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    loaded = load_task(task)
    store = MemoryStore(tmp_path / "home")
    config = LoopConfig(steps=1, device="cpu")
    optimizer = Optimizer(loaded, "", provider=None, store=store, config=config)
    timed = {"compiled": True, "correct": True, "runtime_ms": 0.1, "ref_runtime_ms": 2.0}
    optimizer.referee.begin(Version("", 0, Verdict(**timed, speedup=0.5)))
    honest = Verdict(**timed, speedup=2.0)
    suspect = Verdict(**timed, speedup=20.0, suspect=True)
    assert optimizer.referee.status(honest) == (Status.IMPROVED, 4.0)
    assert optimizer.referee.status(suspect) == (Status.NOT_IMPROVED, None)
    for kind in ("cheating", "not_custom_kernel", "crash", "runtime_error", "oom", "cuda_error"):
        failed = Verdict(compiled=True, error=EvalError(kind, "it failed"))
        assert optimizer.referee.status(failed)[0] == Status(kind)  # a status of its own
    wrong = Verdict(compiled=True, error=EvalError("incorrect", "expected 1.0, got 0.69"))
    assert optimizer.referee.status(wrong)[0] == Status.INCORRECT
    untimed = Verdict(compiled=True, correct=True, note="not timed: Triton interpreter")
    assert optimizer.referee.status(untimed) == (Status.NOT_IMPROVED, None)


@pytest.mark.parametrize(
    ("duels", "runs", "confirmed"),
    [
        ([1.10, 1.06, 1.12], 3, True),  # each run alone is ambiguous; pooled, a win
        ([1.25], 1, True),  # clear at once: not timed again
        ([0.99], 1, False),  # no win by its estimate: not timed again
        ([1.03, 0.98], 2, False),  # pooled, no win by its estimate: stops there
        ([1.04, 1.03, 1.05], 3, False),  # still ambiguous after MAX_DUELS: given up
    ],
)
def test_an_ambiguous_duel_is_timed_again_and_pooled(
    task: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    duels: list[float],
    runs: int,
    confirmed: bool,
) -> None:
    """The duels' numbers are scripted here (their real path is the offline run above):
    what is tested is the rule that times a duel again and pools the runs."""
    from htam_engine import loop, referee
    from htam_engine.evaluate.runner import RUN_TO_RUN_CV
    from htam_engine.memory import MemoryStore
    from htam_engine.stats import Interval
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    asked: list[int] = []

    def compare(*_args: object, run: int, **_options: object) -> Verdict:
        asked.append(run)
        speedup = duels[len(asked) - 1]
        within = Interval(speedup, speedup * 0.99, speedup * 1.01, 40)  # +-1 % in the run
        between = within.with_run_to_run(RUN_TO_RUN_CV["cpu"])
        timed = {"compiled": True, "correct": True, "runtime_ms": 1.0, "device": "cpu"}
        return Verdict(
            **timed, speedup=speedup, interval=between, within_run_half_width=within.half_width
        )

    monkeypatch.setattr(referee, "compare", compare)
    store = MemoryStore(tmp_path / "home")
    config = loop.LoopConfig(steps=1, device="cpu")
    optimizer = loop.Optimizer(load_task(task), "", provider=None, store=store, config=config)
    status, speedup, summary = optimizer.referee.settle(1, "candidate", "g", "l")
    assert summary.duels == len(asked) == runs
    assert asked == list(range(runs)), "each run is its own run, never one cached run again"
    assert summary.confirmed is confirmed
    assert status == (Status.IMPROVED if confirmed else Status.NOT_IMPROVED)
    assert speedup == pytest.approx(math.prod(duels) ** (1 / runs))
    assert summary.low is not None and summary.high is not None
    assert summary.low < speedup < summary.high


def test_a_start_that_does_not_compile_is_said_to_be_yours_and_no_step_runs(
    task: Path, tmp_path: Path, htam_home: Path
) -> None:
    source = task.read_text()
    broken = source.replace("float s = 0.0f;", "float s = 0.0f")  # a missing semicolon
    assert broken != source
    task.write_text(broken)
    proc = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "optimize", str(task), "--provider", "offline",
         "--device", "cpu", "--steps", "2", "--json", "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=900, env=environment_in(htam_home),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]  # no correct start: a failed run
    result = json.loads(proc.stdout)
    assert result["steps"] == []
    assert result["stopped"].startswith("your kernel does not compile"), result["stopped"]


@pytest.mark.parametrize(
    ("first", "second", "timings", "kept"),
    [
        ({"speedup": 0.3}, {"speedup": 0.9}, 2, 0.9),  # a surprising regression: again
        ({"speedup": 0.9}, {"speedup": 0.3}, 1, 0.9),  # an ordinary one: shown as measured
        ({"speedup": 0.95, "noisy": True}, {"speedup": 1.3}, 2, 1.3),  # noise hid a win
        ({"speedup": 0.7, "noisy": True}, {"speedup": 1.3}, 1, 0.7),  # no win, noisy or not
        ({"speedup": 0.95, "converged": False}, {"speedup": 0.9, "noisy": True}, 2, 0.95),
        ({"speedup": 0.3, "cached": True}, {"speedup": 0.9}, 1, 0.3),  # the cache's answer
    ],
    ids=["surprising", "ordinary", "noise-hid-a-win", "noisy-loss", "unsettled", "cached"],
)
def test_a_timing_no_one_should_act_on_is_measured_once_more(
    task: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: dict,
    second: dict,
    timings: int,
    kept: float,
) -> None:
    """The best runs at 1.0x PyTorch. A candidate measured at under half its speed, one
    whose noisy interval reaches past the best and one whose timing did not narrow are
    measured again before anyone is shown them; the steadier of the two is kept (a noisy
    second timing does not replace a quiet first). Scripted timings: what is tested is
    the rule (the real timings' path is the offline run above)."""
    from htam_engine import loop, referee
    from htam_engine.memory import MemoryStore
    from htam_engine.referee import Version
    from htam_engine.stats import Interval
    from htam_engine.task import load_task

    answers = [first, second]
    asked: list[bool] = []

    def evaluate(*_args: object, use_cache: bool, **_options: object) -> Verdict:
        asked.append(use_cache)
        fields = {"converged": True, **answers[len(asked) - 1]}
        speed = fields.pop("speedup")
        return Verdict(compiled=True, correct=True, runtime_ms=1.0, sandbox="bwrap",
                       speedup=speed, interval=Interval(speed, speed * 0.7, speed * 1.4, 20),
                       **fields)  # fmt: skip

    monkeypatch.setattr(referee, "evaluate", evaluate)
    store = MemoryStore(tmp_path / "home")
    config = loop.LoopConfig(steps=1, device="cpu")
    optimizer = loop.Optimizer(load_task(task), "", provider=None, store=store, config=config)
    best = Verdict(compiled=True, correct=True, runtime_ms=1.0, speedup=1.0, sandbox="bwrap",
                   interval=Interval(1.0, 0.95, 1.05, 20), converged=True)  # fmt: skip
    optimizer.referee.begin(Version("start", 0, best))
    verdict = optimizer.referee.measure(1, "candidate")
    assert len(asked) == timings
    assert asked[1:] == [False] * (timings - 1), "measured again, not read from the cache"
    assert verdict.speedup == kept


def test_when_the_model_sets_every_direction_aside_its_own_strategy_is_offered_until_it_stops(
    task: Path, tmp_path: Path
) -> None:
    """A capable model answered `other_direction` to every direction offered for its
    hand-vectorized InstanceNorm: the run ended `no applicable strategy` with 6 steps
    left. Its own strategy is offered next; one that did not win (or failed) is offered
    again, a new change each time, until the model sets it aside too."""
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.runnable import Runnable
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    loaded = load_task(task)
    source = loaded.impl_source or ""
    store = MemoryStore(tmp_path / "home")
    optimizer = Optimizer(loaded, source, provider=None, store=store,
                          config=LoopConfig(steps=1, device="cpu"))  # fmt: skip
    optimizer.runnable = Runnable(llm=True)
    assert optimizer.applicability(store.graph("cpu"), optimizer.referee.start)["own_strategy"]
    offered = set(store.graph("cpu").globals) - {"open_direction"}  # never offered before
    optimizer.runnable.set_aside |= {(direction, source) for direction in offered}
    plan = optimizer.plan(1)
    assert plan is not None
    assert (plan.decision.global_id, plan.decision.local_id) == ("open_direction", "own_strategy")
    optimizer.runnable.tried.add(("own_strategy", source))
    optimizer.runnable.failed["own_strategy"] = Status.COMPILE_ERROR
    again = optimizer.plan(1)
    assert again is not None and again.decision.local_id == "own_strategy"
    optimizer.runnable.set_aside.add(("open_direction", source))  # the model's word
    assert optimizer.plan(1) is None
    # nothing set aside, every named strategy tried (a flat run, whose model is never
    # asked to choose, ended so after 2 of 6 steps): its own strategy all the same
    optimizer.runnable.set_aside.clear()
    optimizer.runnable.tried |= {(lid, source) for lid in store.graph("cpu").locals}
    plan = optimizer.plan(1)
    assert plan is not None and plan.decision.local_id == "own_strategy"
    optimizer.runnable = Runnable(llm=False)  # offline: no model to write it
    optimizer.runnable.tried |= {(lid, source) for lid in store.graph("cpu").locals}
    assert optimizer.plan(1) is None


def test_with_a_model_the_memorys_nothing_more_offers_its_own_strategy_before_it_ends(
    task: Path, tmp_path: Path
) -> None:
    """A flat run ended `converged` after 3 of 6 steps, each a mechanical rewrite that lost
    on a model's GELU: the model never wrote a step. Three named strategies that kept
    nothing withhold only the named ones; the run ends when three own ideas kept nothing."""
    from htam_engine.events import Step
    from htam_engine.llm import ReplayProvider
    from htam_engine.loop import NAMED_SPENT, LoopConfig, Optimizer, RunStopped
    from htam_engine.memory import MemoryStore
    from htam_engine.policy import CONVERGED_AFTER, PolicyConfig
    from htam_engine.runnable import Runnable
    from htam_engine.state import PathEntry
    from htam_engine.task import load_task
    from htam_engine.vocabulary import Status

    loaded = load_task(task)
    store = MemoryStore(tmp_path / "home")
    config = LoopConfig(steps=6, device="cpu", policy=PolicyConfig(mode="flat"))
    cassette = tmp_path / "never-asked.jsonl"  # flat: no choice to ask
    cassette.write_text("")
    provider = ReplayProvider(cassette)
    optimizer = Optimizer(loaded, loaded.impl_source or "", provider=provider, store=store,
                          config=config)  # fmt: skip
    optimizer.runnable = Runnable(llm=True)
    named = [lid for lid, node in store.graph("cpu").locals.items() if not node.open_ended]
    optimizer.episode.path = [PathEntry("x", lid, Status.NOT_IMPROVED) for lid in named[:3]]
    plan = optimizer.plan(1)
    assert plan is not None
    assert (plan.decision.global_id, plan.decision.local_id) == ("open_direction", "own_strategy")
    assert NAMED_SPENT in plan.applicable.values()  # fitting named ones say why not

    def own(number: int) -> Step:
        return Step(number, "open_direction", "own_strategy", "", Status.NOT_IMPROVED, 0.0, 0.9)

    optimizer.steps = [own(k) for k in range(1, CONVERGED_AFTER)]
    assert optimizer.plan(CONVERGED_AFTER) is not None, "two own ideas are not yet enough"
    optimizer.steps.append(own(CONVERGED_AFTER))
    with pytest.raises(RunStopped, match="converged"):
        optimizer.plan(CONVERGED_AFTER + 1)


@pytest.mark.parametrize(("forward", "large"), [("x * 2", True), ("x.sum()", False)])
def test_an_output_large_enough_to_stream_is_a_state_tag(
    tmp_path: Path, forward: str, large: bool
) -> None:
    """From the judge's sizing: a 4 MiB output is `large_output`, a loss's one float not."""
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.task import load_task
    from htam_engine.vocabulary import LARGE_OUTPUT

    problem = tmp_path / "problem.py"
    problem.write_text(
        "import torch\n\nclass Model(torch.nn.Module):\n"
        f"    def forward(self, x):\n        return {forward}\n\n"
        "def get_inputs():\n    return [torch.rand(1024, 1024)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    optimizer = Optimizer(load_task(problem), "", provider=None,
                          store=MemoryStore(tmp_path / "home"),
                          config=LoopConfig(steps=1, device="cpu"))  # fmt: skip
    state = optimizer._state(optimizer.referee.start)
    assert (LARGE_OUTPUT in state.features) is large


def test_code_slower_than_pytorch_is_marked_behind_and_a_failing_judge_says_why(
    task: Path, tmp_path: Path
) -> None:
    """`behind_reference` withholds `stop` from a chooser (test_policy_stop); a run once
    ended "evaluator_error" and nothing said why."""
    from htam_engine.evaluate import EvalError
    from htam_engine.loop import LoopConfig, Optimizer, _stopped_by
    from htam_engine.memory import MemoryStore
    from htam_engine.referee import Version
    from htam_engine.stats import Interval
    from htam_engine.task import load_task
    from htam_engine.vocabulary import BEHIND_REFERENCE, ErrorKind

    loaded = load_task(task)
    optimizer = Optimizer(loaded, loaded.impl_source or "", provider=None,
                          store=MemoryStore(tmp_path / "home"),
                          config=LoopConfig(steps=1, device="cpu"))  # fmt: skip
    source = loaded.impl_source or ""
    slower = Version(source, 0, Verdict(correct=True, interval=Interval(0.87, 0.8, 0.96, 9)))
    unsure = Version(source, 0, Verdict(correct=True, interval=Interval(0.95, 0.8, 1.1, 9)))
    assert BEHIND_REFERENCE in optimizer._state(slower).features
    assert BEHIND_REFERENCE not in optimizer._state(unsure).features

    failed = Verdict(error=EvalError(ErrorKind.EVALUATOR_ERROR, "the judge failed during time"))
    assert _stopped_by(failed) == "evaluator_error: the judge failed during time"
