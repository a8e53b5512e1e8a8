"""The event stream between `htam optimize --events` and the server: typed both ways."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from htam_engine import events
from htam_engine.decisions import GlobalDecision
from htam_engine.evaluate.verdict import Duel, ErrorKind, EvalError, Verdict
from htam_engine.stats import Interval

ROOT = Path(__file__).resolve().parent.parent


def test_every_kind_round_trips_through_its_wire_form() -> None:
    samples: list[events.Event] = [
        events.Start("softmax", 3, "offline", "no key", "cpu"),
        events.Phase(1, 3, "verify", "memory_access", "vectorized", 12.5),
        events.Phase(0, 3, "compile", time=3.0, left_s=41.5),
        events.Step(
            2,
            "g",
            "l",
            "why",
            "improved",
            0.4,
            1.5,
            GlobalDecision.from_json({"chosen": "g"}),
            None,
            Verdict(compiled=True, correct=True, speedup=2.0),
            "src",
            versus_best=Duel.pooled(Interval(1.1, 1.05, 1.15, 80), confirmed=True, duels=2),
            phases={"select": 0.01, "compile": 3.2, "time": 2.5},
        ),
        events.Result("run", "softmax", True, 1.5, 0.4, 2, "completed", "out"),
        events.Result(
            "run",
            "softmax",
            False,
            None,
            None,
            0,
            "your kernel does not compile",
            "out",
            start_error=EvalError("compile_error", "expected ';'", "", 22),
        ),
        events.Failed("no such file", "user_error"),
    ]
    for event in samples:
        wire = json.loads(events.to_line(event))
        assert wire["event"] == event.kind
        assert events.parse_line(events.to_line(event)) == event
    step_wire = json.loads(events.to_line(samples[3]))
    assert step_wire["global"] == "g" and step_wire["local"] == "l"


def test_step_fields_the_server_reads() -> None:
    step = events.Step(
        1,
        "g",
        "l",
        "",
        "incorrect",
        -1.0,
        None,
        verdict=Verdict(speedup=9.0, error=EvalError(ErrorKind.INCORRECT, "wrong", line=3)),
    )
    assert not step.correct and step.ref_speedup is None
    assert step.error is not None and step.error.line == 3


def test_a_step_of_an_older_engine_reads_with_defaults() -> None:
    """What older versions stored (a partial verdict, no duel) still reads."""
    wire = {"event": "step", "step": 1, "global": "g", "local": "l", "reason": ""}
    wire |= {"status": "incorrect", "reward": -1.0, "speedup": None, "versus_best": {}}
    wire["verdict"] = {"compiled": True, "correct": False, "error": None, "retired": 1}
    step = events.from_json(wire)
    assert isinstance(step, events.Step)
    assert step.verdict == Verdict(compiled=True) and step.versus_best is None


@pytest.mark.parametrize(
    "line", ["", "not json", "[1, 2]", '{"event": "nope"}', '{"event": "phase", "step": 1}']
)
def test_what_is_not_an_event_is_a_clear_error(line: str) -> None:
    with pytest.raises(events.EventError):
        events.parse_line(line)


def test_a_newer_engine_s_extra_fields_are_ignored() -> None:
    wire = {**events.to_json(events.Failed("x")), "hint": "a field this server does not know"}
    assert events.from_json(wire) == events.Failed("x")


@pytest.mark.parametrize("flag", ["--events", "--json"])
def test_a_user_error_still_keeps_the_stdout_contract(flag: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    proc = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "optimize", str(missing), flag],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    if flag == "--events":
        last = events.parse_line(lines[0])
        assert isinstance(last, events.Failed) and "missing.py" in last.message
    else:
        assert "missing.py" in json.loads(lines[0])["error"]["message"]


def test_a_phase_clock_counts_each_phase_until_the_next() -> None:
    clock = events.PhaseClock()
    clock.enter("compile")
    time.sleep(0.05)
    clock.enter("time")
    time.sleep(0.02)
    clock.enter("compile")  # a re-timing adds to the phase it repeats
    time.sleep(0.03)
    laps = clock.lap()
    assert set(laps) == {"compile", "time"}
    assert laps["compile"] >= 0.08 and laps["time"] >= 0.02
    assert clock.lap() == {}  # nothing since: an empty lap, and no step counted
    assert len(clock.step_s) == 1 and clock.step_s[0] >= 0.1


def test_time_left_comes_from_recorded_step_times() -> None:
    assert events.PhaseClock().left_s(3) is None  # nothing recorded: no guess
    clock = events.PhaseClock(recorded=[10.0, 30.0, 20.0])
    left = clock.left_s(3)
    assert left is not None and 59.0 <= left <= 60.0  # 3 steps at the median, 20 s
    clock.enter("select")
    clock.lap(step=False)  # a closing duel: not a step
    assert clock.step_s == [10.0, 30.0, 20.0]


def test_recorded_step_seconds_read_stored_trajectories() -> None:
    from htam_engine.episode import recorded_step_seconds

    runs = [
        ("a", {"task": "softmax", "steps": [{"phases": {"compile": 3.0, "time": 2.0}}]}),
        ("b", {"task": "gelu", "steps": [{"phases": {"compile": 9.0}}, {"status": "old"}]}),
        ("c", "not a trajectory"),
    ]
    assert recorded_step_seconds(runs, "softmax") == [5.0]
    assert recorded_step_seconds(runs, "matmul") == [5.0, 9.0]  # none of its own: any
    assert recorded_step_seconds([], "softmax") == []
