"""Plateau moves: a correct non-win becomes the next step's base only with a paired
interval containing 1.0 and an edge out of its direction that predicts a gain."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.examples import EXAMPLES

from htam_engine.evaluate import Verdict
from htam_engine.evaluate.runner import RUN_TO_RUN_CV
from htam_engine.evaluate.verdict import Duel
from htam_engine.memory import MemoryStore
from htam_engine.memory.model import load_seed
from htam_engine.stats import Interval
from htam_engine.strategies.plateau import plateau_base
from htam_engine.task import load_task
from htam_engine.vocabulary import Status


def duel(low: float, high: float) -> Duel:
    return Duel((low + high) / 2, low, high, False, 1)


def test_a_tie_after_flags_is_kept_for_the_vectorizer() -> None:
    graph = load_seed("cpu")
    why = plateau_base(graph, "compiler_flags", duel(0.97, 1.08))
    assert why is not None and why.startswith("plateau: compiler_flags -> ")


def test_a_clear_loss_or_a_missing_interval_is_not_kept() -> None:
    graph = load_seed("cpu")
    assert plateau_base(graph, "compiler_flags", duel(0.80, 0.95)) is None
    assert plateau_base(graph, "compiler_flags", None) is None
    assert plateau_base(graph, "compiler_flags", Duel.failed(None)) is None


def test_no_predicted_follow_up_means_no_plateau() -> None:
    graph = load_seed("cpu")
    for (src, _), edge in graph.edges.items():
        if src == "compiler_flags":
            edge.prior = 0.0
    assert plateau_base(graph, "compiler_flags", duel(0.97, 1.08)) is None


def test_the_loop_starts_the_next_step_from_a_plateau_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verdicts and duels scripted (their real path is the offline end-to-end run): step 1's
    candidate ties the best in pairs; step 2 starts from it; the best is still the start."""
    from htam_engine import loop, referee

    start = (EXAMPLES / "softmax" / "cpu_naive.py").read_text()
    timed = {"compiled": True, "correct": True, "device": "cpu", "converged": True}

    def evaluate(_task: object, source: str, **_options: object) -> Verdict:
        speedup = 1.0 if source == start else 1.1  # every rewrite looks like a win alone
        return Verdict(**timed, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0, speedup=speedup)

    def compare(*_args: object, run: int, **_options: object) -> Verdict:
        within = Interval(1.01, 0.98, 1.04, 40)
        tie = within.with_run_to_run(RUN_TO_RUN_CV["cpu"])
        return Verdict(
            **timed,
            runtime_ms=1.0,
            speedup=1.01,
            interval=tie,
            within_run_half_width=within.half_width,
        )

    monkeypatch.setattr(referee, "evaluate", evaluate)
    monkeypatch.setattr(referee, "compare", compare)
    store = MemoryStore(tmp_path / "home")
    config = loop.LoopConfig(steps=2, device="cpu", use_cache=False)
    task = tmp_path / "softmax"
    shutil.copytree(EXAMPLES / "softmax", task)
    optimizer = loop.Optimizer(
        load_task(task / "cpu_naive.py"), start, provider=None, store=store, config=config
    )
    result = optimizer.run()
    first, second = result.steps
    assert first.status == Status.NOT_IMPROVED and first.versus_best is not None
    assert (second.local_id, first.source) in optimizer.runnable.tried  # step 2 built on step 1
    assert result.best_source == start and result.best_step == 0
