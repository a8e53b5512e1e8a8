"""The judge started ahead (`standby.keep_warm`): the next evaluation takes it, each judge
serves one job and goes with its folder, and a spare that does not fit (other limits,
another reference) is not used."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from htam_engine.evaluate import evaluate, runner, standby
from htam_engine.evaluate.jobspec import ROLES
from htam_engine.evaluate.protocol import Sized
from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.paths import subdir
from htam_engine.procs import stat_fields
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
    assert ahead is not None
    if change == "limits":
        ahead = replace(ahead, memory_mb=ahead.memory_mb // 2)
    else:
        reference += "\n# another reference\n"
    taken = standby._SPARE.take(ahead, reference)
    try:
        assert taken.jobdir != spare.jobdir
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
        if all((spare.jobdir / role / "init.pt").exists() for role in ROLES):
            break
        time.sleep(0.1)
    assert all((spare.jobdir / role / "init.pt").exists() for role in ROLES)
    assert not any((spare.jobdir / role / "candidate").exists() for role in ROLES)
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


def _cpu_ticks(pid: int) -> int:
    fields = stat_fields(f"/proc/{pid}/stat")
    return int(fields[11]) + int(fields[12])  # utime, stime


def _waits_after_torch(pid: int) -> bool:
    """The process imported torch and then used no CPU for half a second: it waits."""
    before = _cpu_ticks(pid)
    time.sleep(0.5)
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text() and _cpu_ticks(pid) == before


def test_a_held_judge_makes_no_inputs_until_an_evaluation_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A problem's first size estimate (`htam eval`, `htam optimize`) starts the judge its
    evaluation takes, held: it sizes the problem on meta tensors, beside its workers'
    start, and its input sets (memory the estimate may refuse) wait for the evaluation
    that takes it, which no other judge serves (without `keep_warm`, none follows)."""
    path = FIXTURES / "correct.py"
    task = with_start(with_policy(load_task(path)), path)
    sized = Sized(64 * 256 * 4, 64 * 256 * 4, shapes=["float32[64, 256]"])
    assert runner.size_problem(task, "cpu") == sized
    held = _spare()
    try:
        for _ in range(120):  # its torch import: up to a minute on a busy CI
            if _waits_after_torch(held.judge.popen.pid):
                break
        assert _waits_after_torch(held.judge.popen.pid)
        assert not any((held.jobdir / role / "init.pt").exists() for role in ROLES)
        started: list[Any] = []
        monkeypatch.setattr(standby, "start", lambda *args: started.append(args))
        assert task.impl_source is not None
        verdict = evaluate(task, task.impl_source, device="cpu", limits=Limits(), use_cache=False)
        assert verdict.correct, verdict.error
        assert not started and not held.jobdir.exists(), "the held judge served it"
        assert standby._SPARE.started is None
    finally:
        standby._SPARE.release()


def test_the_judge_starts_its_workers_before_it_imports_torch() -> None:
    """Three torch imports (the judge's and both workers') run at once, not the
    workers' after the judge's: its entry module imports no torch."""
    code = "import sys, htam_engine.evaluate.judge; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def _lines(stream: Any) -> queue.Queue[str]:
    """The lines of `stream`, read by a thread as they come."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def _until(lines: queue.Queue[str], start: str, seen: list[str]) -> str:
    while True:
        line = lines.get(timeout=180)  # a busy CI: a judge's start takes a minute there
        seen.append(line)
        if line.startswith(start):
            return line


def _jobs() -> list[Path]:
    return sorted(subdir("jobs").iterdir())


def _ctrl_c_as_on_a_terminal() -> None:
    """SIGINT's default action in the child, as in a terminal's foreground: a test run
    started in the background of a non-interactive shell ignores SIGINT, and a child
    inherits that (the watch then never hears the test's Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_eval_watch_evaluates_each_save_with_the_judge_started_while_you_edit(
    tmp_path: Path,
) -> None:
    """`htam eval --watch`: a verdict at every save; between saves a judge waits, started
    for the next evaluation, which it then serves; a file gone mid-save is said, and the
    watch goes on; Ctrl-C leaves nothing behind."""
    for name in ("reference.py", "correct.py"):
        (tmp_path / name).write_text((FIXTURES / name).read_text())
    candidate = tmp_path / "correct.py"
    command = [sys.executable, "-m", "htam_engine.cli", "eval", str(tmp_path / "reference.py")]
    watch = subprocess.Popen(
        [*command, str(candidate), "--watch", "--device", "cpu"],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_on_a_terminal,
    )
    assert watch.stderr is not None
    lines, seen = _lines(watch.stderr), []
    try:
        assert _until(lines, "correct on 3 input sets", seen)
        _until(lines, "htam: watching", seen)
        waiting = _jobs()
        assert len(waiting) == 1, "one judge waits for the next save"
        candidate.write_text((FIXTURES / "incorrect.py").read_text())
        assert _until(lines, "incorrect:", seen)
        _until(lines, "htam: watching", seen)
        assert not waiting[0].exists(), "the judge that waited served that save"
        waiting = _jobs()
        assert len(waiting) == 1, "and another waits"
        candidate.unlink()  # an editor's save may remove the file first
        assert _until(lines, "htam: error: cannot read candidate", seen)
        _until(lines, "htam: watching", seen)
        assert _jobs() == waiting and watch.poll() is None, "it waits on, with its judge"
        watch.send_signal(signal.SIGINT)
        assert watch.wait(60) == 130
        assert not _jobs(), "Ctrl-C leaves no judge and no job folder"
    finally:
        watch.kill()
        watch.wait()
    assert "Traceback" not in "".join(seen), seen


def test_eval_watch_is_for_people_not_for_json() -> None:
    path = str(FIXTURES / "correct.py")
    command = [sys.executable, "-m", "htam_engine.cli", "eval", path, path]
    done = subprocess.run(
        [*command, "--watch", "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "drop --json" in done.stderr
    assert json.loads(done.stdout)["error"]["kind"] == "user_error"


def test_a_judge_started_before_its_task_serves_the_task_given_later() -> None:
    """A spare kept between commands (`keeper`) is started under conditions only."""
    ahead = runner._ahead_of(load_task(FIXTURES / "correct.py"), "cpu", Limits(memory_mb=4096))
    started = standby.launch(ahead.conditions)
    try:
        assert not (started.jobdir / "reference.py").exists()
        started.assign(ahead, (FIXTURES / "reference.py").read_text())
        sized = started.size(120)
        assert sized.inputs and sized.inputs > 0, sized
    finally:
        started.finish()
