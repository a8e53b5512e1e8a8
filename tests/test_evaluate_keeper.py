"""The judge kept between commands (`keeper`): a one-shot `htam eval` leaves one, the
next command borrows it, a borrower's death or the idle time leaves nothing behind, and
without bwrap there is none."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from htam_engine.evaluate import keeper, runner
from htam_engine.evaluate.jobspec import Conditions, JobSpec
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.paths import home, subdir
from htam_engine.task import load_task

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sandbox_mode() != "bwrap", reason="a keeper runs only under bwrap"),
]

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
CONDITIONS = Conditions(device="cpu", backend="cpu", threads=1, memory_mb=4096)


def _job_under(conditions: Conditions) -> JobSpec:
    """A task's job, as a command under `conditions` would give it."""
    ahead = runner._ahead_of(load_task(FIXTURES / "correct.py"), conditions.device, None)
    return replace(ahead, **conditions.to_json())


@pytest.fixture
def keeping(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keepers on for this test; whatever keeper it started is stopped after it."""
    monkeypatch.setenv(keeper.ENV_SWITCH, "1")
    try:
        yield
    finally:
        keeper.stop(home())
        _until(lambda: _keeper_pid() is None, "the keeper stops on `keeper.stop`")
        assert not _spares(), f"no judge outlives its keeper: {_log()}"


def _keeper_pid() -> int | None:
    """The pid written in the lock, if that keeper still holds it."""
    return keeper.holder(home())


def _spares() -> list[Path]:
    """Job folders of judges started and given no task yet."""
    return [
        folder
        for folder in subdir("jobs").glob("eval-*")
        if (folder / "conditions.json").exists() and not (folder / "standby.json").exists()
    ]


def _until(done: Callable[[], object], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"not within {limit_s:g} s: {what}"
        time.sleep(0.1)


def _log() -> str:
    path = subdir("keeper") / keeper.LOG_NAME
    return path.read_text() if path.exists() else ""


def _eval(candidate: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "htam_engine.cli", "eval", "--device", "cpu"]
    paths = [str(FIXTURES / "reference.py"), str(FIXTURES / candidate)]
    return subprocess.run([*command, *paths], capture_output=True, text=True, timeout=300)


def test_a_one_shot_eval_leaves_a_judge_that_the_next_command_borrows(keeping: None) -> None:
    first = _eval("correct.py")
    assert first.returncode == 0, first.stderr
    _until(lambda: len(_spares()) == 1, "a judge waits after the first command")
    (waiting,) = _spares()
    assert (subdir("keeper") / keeper.SOCKET_NAME).stat().st_mode & 0o777 == 0o600
    assert subdir("keeper").stat().st_mode & 0o777 == 0o700
    wrong = _eval("incorrect.py")  # nothing of the first job is in the judge it borrows
    assert wrong.returncode == 1 and "incorrect:" in wrong.stderr, wrong.stderr
    assert f"lent the judge of {waiting.name}" in _log(), _log()
    assert not waiting.exists(), "a lent judge serves one command and goes"
    _until(lambda: len(_spares()) == 1, "the command asked for the next judge")
    assert _spares()[0] != waiting


def test_a_borrower_that_dies_leaves_no_judge_behind(keeping: None) -> None:
    keeper.ensure(CONDITIONS)
    _until(lambda: len(_spares()) == 1, "the keeper starts a judge")
    (waiting,) = _spares()
    borrower = subprocess.Popen(
        [sys.executable, "-c", _BORROW, json.dumps(CONDITIONS.to_json())],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert borrower.stdout is not None
    assert borrower.stdout.readline().strip() == str(waiting)
    borrower.kill()  # mid-job, without a word to the keeper
    borrower.wait()
    _until(lambda: not waiting.exists(), "the keeper takes the lent judge back and kills it")
    assert _keeper_pid() is not None, "and keeps going"
    assert not _spares(), "no new judge before a command asks for one"
    keeper.ensure(CONDITIONS)
    _until(lambda: len(_spares()) == 1, "a command's request starts the next")


_BORROW = """
import sys, json, time
from htam_engine.evaluate import keeper
from htam_engine.evaluate.jobspec import Conditions
started = keeper.borrow(Conditions.from_json(json.loads(sys.argv[1])))
print(started.jobdir if started else None, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("change", ["conditions", "environment"])
def test_a_command_under_other_conditions_gets_no_judge_and_its_request_changes_the_spare(
    keeping: None, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    keeper.ensure(CONDITIONS)
    _until(lambda: len(_spares()) == 1, "the keeper starts a judge")
    (waiting,) = _spares()
    other = CONDITIONS
    if change == "conditions":
        other = replace(CONDITIONS, memory_mb=CONDITIONS.memory_mb * 2)
    else:  # the judge's environment: another GPU, another compiler, ...
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert keeper.borrow(other) is None
    keeper.ensure(other)
    _until(lambda: not waiting.exists() and len(_spares()) == 1, "a spare for the new ones")
    started = keeper.borrow(other)
    assert started is not None and started.conditions == other
    started.assign(_job_under(other), (FIXTURES / "reference.py").read_text())
    started.finish()
    _until(lambda: not started.jobdir.exists(), "given back, it is gone")


def test_a_command_running_other_code_retires_the_keeper_and_starts_its_own(
    keeping: None,
) -> None:
    """After an upgrade (or in another interpreter) no judge of the old code is lent."""
    keeper.ensure(CONDITIONS)
    _until(lambda: len(_spares()) == 1, "the keeper starts a judge")
    old = _keeper_pid()
    upgraded = {
        "borrow": CONDITIONS.to_json(),
        "context": {**keeper.context(), "code": "0" * 16},
    }
    assert keeper._request(upgraded) == {"retiring": True}
    _until(lambda: _keeper_pid() is None and not _spares(), "it leaves, with its judge")
    keeper.ensure(CONDITIONS)
    _until(lambda: _keeper_pid() not in (None, old), "the command started a keeper of its own")


def test_the_keeper_leaves_after_its_idle_time_and_takes_its_judge(keeping: None) -> None:
    conditions = json.dumps(CONDITIONS.to_json())
    command = [sys.executable, "-m", "htam_engine.evaluate.keeper", conditions, "3"]
    process = subprocess.Popen(command)
    _until(lambda: len(_spares()) == 1, "the keeper starts a judge")
    (waiting,) = _spares()
    assert process.wait(timeout=60) == 0
    assert not waiting.exists() and not (subdir("keeper") / keeper.SOCKET_NAME).exists()


def test_without_the_sandbox_there_is_no_keeper(
    keeping: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate outside a sandbox could plant a keeper lending a judge of its own."""
    monkeypatch.setenv("HTAM_SANDBOX", "none")
    sandbox_mode.cache_clear()
    try:
        assert not keeper.enabled()
        keeper.ensure(CONDITIONS)
        assert keeper.borrow(CONDITIONS) is None
        assert _keeper_pid() is None and not _spares()
    finally:
        monkeypatch.undo()
        sandbox_mode.cache_clear()
