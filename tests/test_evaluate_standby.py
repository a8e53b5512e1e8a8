"""The judge started ahead (`standby.keep_warm`): the next evaluation takes it, each judge
serves one job and goes with its folder, and a spare that does not fit (other limits,
another reference) is not used."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from htam_engine.evaluate import evaluate, runner, standby
from htam_engine.evaluate.process import Child
from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.task import load_task, with_policy, with_start

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


@pytest.mark.parametrize("change", ["limits", "reference"])
def test_a_spare_for_another_job_is_not_used(warm: None, change: str) -> None:
    run("correct.py")
    spare = _spare()
    ahead, reference = spare.ahead, spare.reference
    if change == "limits":
        ahead = {**ahead, "memory_mb": ahead["memory_mb"] // 2}
    else:
        reference += "\n# another reference\n"
    taken, spared = standby._SPARE.take(ahead, reference)
    try:
        assert taken.jobdir != spare.jobdir and not spared
        assert (taken.ahead, taken.reference) == (ahead, reference)
        assert (taken.jobdir / "reference.py").read_text() == reference
        assert spare.judge.popen.poll() is not None and not spare.jobdir.exists()
    finally:
        taken.finish()


def test_a_spare_prepares_its_inputs_before_any_candidate(warm: None) -> None:
    """The spare's judge has made its input sets and expected outputs (its workers are
    waiting) before the caller wrote a candidate into its folder."""
    run("correct.py")
    spare = _spare()
    for _ in range(300):  # the spare starts in the background: up to 30 s on a busy CI
        if all((spare.jobdir / role / "init.pt").exists() for role in standby.ROLES):
            break
        time.sleep(0.1)
    assert all((spare.jobdir / role / "init.pt").exists() for role in standby.ROLES)
    assert not any((spare.jobdir / role / "candidate").exists() for role in standby.ROLES)
    assert not (spare.jobdir / "job.json").exists()


def test_a_judge_started_ahead_for_a_task_serves_its_first_evaluation(
    warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `htam_engine.warm` starts before the language server's next job fits that
    job's first evaluation: no other judge is started for it (only the next spare)."""
    path = FIXTURES / "correct.py"
    runner.start_ahead(with_policy(load_task(path)), "cpu")
    ahead = _spare()
    started: list[standby.Started] = []
    start = standby.start

    def counted(*args: Any) -> standby.Started:
        started.append(start(*args))
        return started[-1]

    monkeypatch.setattr(standby, "start", counted)
    task = with_start(with_policy(load_task(path)), path)
    assert task.impl_source is not None
    verdict = evaluate(task, task.impl_source, device="cpu", limits=Limits(), use_cache=False)
    assert verdict.correct, verdict.error
    assert not ahead.jobdir.exists() and len(started) == 1, "the spare served it"
    assert _spare() is started[0]


def test_the_next_judge_starts_beside_compile_and_is_stopped_while_timed(
    warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spare for the next evaluation starts as soon as this one has taken its own
    spare; every process of it is stopped until this timing ends, and goes on afterwards."""
    run("correct.py")  # started cold: the next spare started only after it
    task = load_task(FIXTURES / "correct.py")
    assert task.impl_source is not None
    seen: dict[str, standby.Started | None] = {}
    states: list[list[str]] = []
    thaw = standby.thaw

    def on_phase(phase: str) -> None:
        seen[phase] = standby._SPARE.started

    def thawed(child: Child) -> None:  # the timing is over: how was the spare?
        states.append([_state(pid) for pid in child.frozen])
        thaw(child)

    monkeypatch.setattr(standby, "thaw", thawed)
    verdict = evaluate(
        task, task.impl_source, device="cpu", limits=QUICK, use_cache=False, on_phase=on_phase
    )
    assert verdict.correct and verdict.speedup, verdict.error
    spare = seen["verify"]
    assert spare is not None and seen["time"] is spare, "started before verification"
    assert len(states) == 1 and "T" in states[0], states
    assert set(states[0]) <= {"T", "Z", "gone"}, "stopped (or exited, as a bwrap's setup)"
    assert _spare() is spare and _state(spare.judge.popen.pid) != "T", "it goes on"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_judge_starts_its_workers_before_it_imports_torch() -> None:
    """Three torch imports (the judge's and both workers') run at once, not the
    workers' after the judge's: its entry module imports no torch."""
    code = "import sys, htam_engine.evaluate.judge; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
