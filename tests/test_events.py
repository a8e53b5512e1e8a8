"""The event stream between `htam optimize --events` and the server: typed both ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from htam_engine import events
from htam_engine.evaluate.verdict import Duel, ErrorKind, EvalError, Verdict
from htam_engine.stats import Interval

ROOT = Path(__file__).resolve().parent.parent


def test_every_kind_round_trips_through_its_wire_form() -> None:
    samples: list[events.Event] = [
        events.Start("softmax", 3, "offline", "no key", "cpu"),
        events.Phase(1, 3, "verify", "memory_access", "vectorized", 12.5),
        events.Step(
            2,
            "g",
            "l",
            "why",
            "improved",
            0.4,
            1.5,
            {"chosen": "g"},
            {},
            Verdict(compiled=True, correct=True, speedup=2.0),
            "src",
            versus_best=Duel.pooled(Interval(1.1, 1.05, 1.15, 80), confirmed=True, duels=2),
        ),
        events.Result("run", "softmax", True, 1.5, 0.4, 2, "completed", "out"),
        events.Failed("no such file", "user_error"),
    ]
    for event in samples:
        wire = json.loads(events.to_line(event))
        assert wire["event"] == event.kind
        assert events.parse_line(events.to_line(event)) == event
    step_wire = json.loads(events.to_line(samples[2]))
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
