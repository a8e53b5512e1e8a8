"""The judge cannot be crashed or blamed on the reference: it shares no mapping with a
worker, every worker message is capped, its own failure is `evaluator_error` (never
cached) and a failure the candidate provoked is `cheating` with the check named."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.candidates import CANDIDATES, MODES, measure, sandboxed

from htam_engine.evaluate import Limits, evaluate
from htam_engine.evaluate.process import MAX_LINE, Child
from htam_engine.task import load_task
from htam_engine.vocabulary import ErrorKind


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("name", "check"),
    [("truncate_buffers", "output.buffer"), ("flood_pipe", "protocol.messages")],
)
def test_a_candidate_that_attacks_the_judge_is_cheating_with_the_check_named(
    name, check, mode, monkeypatch
):
    with sandboxed(mode, monkeypatch):
        verdict = measure(CANDIDATES / "adversarial" / f"{name}.py")
    assert verdict.error is not None and verdict.error.kind == "cheating", verdict.error
    assert verdict.error.message.startswith(check), verdict.error.message
    assert "reference" not in verdict.error.message


def test_a_flooding_child_costs_the_reader_one_capped_line(tmp_path):
    """A line of 64 MB without a newline: the reader keeps at most MAX_LINE of it."""
    flood = "import sys; sys.stdout.write('x' * (64 << 20)); sys.stdout.flush()"
    child = Child("candidate", [sys.executable, "-c", flood], tmp_path, {}, tmp_path / "log")
    try:
        with pytest.raises(Exception) as stop:
            child.wait_for("never", 30, "a call", threading.Event())
        assert getattr(stop.value, "kind", None) == "cheating"
        assert "protocol.messages" in str(stop.value) and str(MAX_LINE) in str(stop.value)
    finally:
        child.kill()


def _judge_pids() -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if b"htam_engine.evaluate.judge" in cmdline:
                found.append(int(entry.name))
    return found


def test_a_judge_that_dies_is_an_evaluator_error_and_never_cached():
    path = CANDIDATES / "honest" / "plain.py"
    task, source = load_task(path), path.read_text()
    limits = Limits(compile_s=60, verify_s=30, time_s=60)
    result = []
    run = threading.Thread(
        target=lambda: result.append(evaluate(task, source, device="cpu", limits=limits))
    )
    run.start()
    deadline = time.monotonic() + 60
    while not _judge_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # its workers start
    for pid in _judge_pids():
        os.kill(pid, signal.SIGKILL)
    run.join(timeout=120)
    verdict = result[0]
    assert verdict.error is not None and verdict.error.kind == ErrorKind.EVALUATOR_ERROR
    assert "judge" in verdict.error.message
    again = evaluate(task, source, device="cpu", limits=limits)  # not the cached failure
    assert again.error is None and again.correct, again.error
