"""benchmarks/bench_step.py: a run's events are read into phases, steps, start and close."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_step", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _phase(step: int, phase: str) -> dict[str, Any]:
    return {"event": "phase", "step": step, "phase": phase}


def test_a_run_s_events_give_its_breakdown() -> None:
    bench = _load()
    events = [
        (0.5, {"event": "start"}),
        (1.0, _phase(0, "compile")),
        (4.0, _phase(0, "time")),
        (6.0, _phase(1, "select")),
        (6.5, _phase(1, "compile")),
        (9.0, _phase(1, "time")),
        (11.0, _phase(1, "update")),
        (11.5, {"event": "step", "status": "improved"}),
        (12.0, _phase(2, "select")),
        (13.0, {"event": "step", "status": "not_improved"}),
        (13.0, _phase(2, "confirm")),
        (17.0, {"event": "result"}),
    ]
    found = bench.breakdown({"events": events, "wall_s": 18.0, "rc": 0, "error": ""})
    assert found["first_event_s"] == 0.5
    assert found["start_s"] == pytest.approx(5.5)  # the first event to step 1's first phase
    assert found["steps_s"] == pytest.approx([5.5, 1.0])
    assert found["closing_s"] == pytest.approx(4.0)  # the last step to the result
    phases = found["phases_s"]
    assert phases["compile"] == pytest.approx(3.0 + 2.5)
    assert phases["time"] == pytest.approx(2.0 + 2.0)
    assert phases["confirm"] == pytest.approx(4.0)
    assert found["statuses"] == ["improved", "not_improved"]
    summary = bench.summary([{"example": "x", **found}])
    assert summary["step_s"] == pytest.approx(3.25) and summary["compile"] == pytest.approx(5.5)
    assert "| a, idle |" in bench.table({"a, idle": summary})


def test_one_shot_evals_are_tabled_apart_seen_and_first() -> None:
    bench = _load()
    seen = {"wall_s": 5.0, "compile": 2.0, "verify": 0.3, "time": 2.0, "first": False}
    first = {"wall_s": 9.0, "compile": 2.5, "verify": 0.3, "time": 2.0, "first": True}
    table = bench.eval_table({"a": [seen, {**seen, "wall_s": 7.0}, first]})
    assert "| a | seen before (2) | 6.00 | 4.00 | 2.00 | 0.30 | 2.00 |" in table
    assert "| a | first of a problem (1) | 9.00 | 7.00 | 2.50 | 0.30 | 2.00 |" in table


def test_watched_saves_are_tabled_beside_one_shots_per_example_and_over_all() -> None:
    bench = _load()
    rows = [
        {"example": "a", "one_shot_s": 5.0, "saved_s": 3.0},
        {"example": "a", "one_shot_s": 7.0, "saved_s": 2.0},
        {"example": "b", "one_shot_s": 9.0, "saved_s": 4.0},
    ]
    table = bench.watch_table(rows)
    assert "| a (2) | 6.00 | 2.50 |" in table and "| b (1) | 9.00 | 4.00 |" in table
    assert table.endswith("| all (3) | 7.00 | 3.00 |")


def test_a_watched_verdict_is_its_first_line_and_a_watch_that_ended_is_an_error() -> None:
    bench = _load()
    lines = iter(["incorrect: output.values\n", "  3 | y = x\n", "htam: watching c.py\n"])
    assert bench._next_verdict(lines) == "incorrect: output.values"
    with pytest.raises(RuntimeError, match="ended: correct on 3"):
        bench._next_verdict(iter(["correct on 3 input sets\n"]))
