"""The judge started ahead (`standby.keep_warm`): the next evaluation takes it, each judge
serves one job and goes with its folder, and a spare that does not fit is not used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from htam_engine.evaluate import evaluate, standby
from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.task import load_task

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
QUICK = Limits(compile_s=60, verify_s=30, time_s=60)


@pytest.fixture
def warm() -> Iterator[None]:
    standby.keep_warm(True)
    try:
        yield
    finally:
        standby.keep_warm(False)


def run(name: str) -> Verdict:
    task = load_task(FIXTURES / name)
    assert task.impl_source is not None
    return evaluate(task, task.impl_source, device="cpu", limits=QUICK, use_cache=False)


def _spare() -> standby.Started:
    spare = standby._SPARE.started
    assert spare is not None and spare.judge.popen.poll() is None, "a spare stands by"
    return spare


def test_each_evaluation_takes_the_spare_and_leaves_a_fresh_one(warm: None) -> None:
    first = run("correct.py")
    assert first.correct, first.error
    spare = _spare()
    wrong = run("incorrect.py")  # served by that spare: nothing of the first job is in it
    assert wrong.error is not None and wrong.error.kind == "incorrect"
    assert spare.judge.popen.poll() is not None and not spare.jobdir.exists(), "used once, gone"
    assert _spare().jobdir != spare.jobdir
    standby.keep_warm(False)
    assert standby._SPARE.started is None and not any(subdir("jobs").iterdir())


def test_a_spare_for_other_workers_is_not_used(warm: None) -> None:
    run("correct.py")
    spare = _spare()
    other = {**spare.workers, "memory_mb": spare.workers["memory_mb"] // 2}
    taken = standby._SPARE.take(other)
    try:
        assert taken.jobdir != spare.jobdir and taken.workers == other
        assert spare.judge.popen.poll() is not None and not spare.jobdir.exists()
    finally:
        taken.finish()
