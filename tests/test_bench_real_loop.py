"""benchmarks/real_loop.py: the real `htam optimize` subprocess, summarized per phase."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_loop.py"


@pytest.mark.slow
def test_one_example_one_step_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "loop.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--steps", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert "error" not in run, run["error"]
    assert len(run["steps"]) == 1 and len(run["phase_seconds"]) == 2  # start + one step
    start_phases = run["phase_seconds"][0]
    assert all(start_phases[p] > 0 for p in ("compile", "verify", "time"))
    summary = data["summary"]
    assert summary["candidates"] == 1 and 0 <= summary["correct_rate"] <= 1
    assert summary["geomean_start_over_pytorch"] > 0
    assert data["markdown"] in done.stdout


def test_bad_steps_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--steps must be at least 1" in done.stderr and "Traceback" not in done.stderr


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("real_loop_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tasks_are_the_examples_and_eight_kernelbench_starts() -> None:
    script = _script()
    bench = script.task_paths("cpu", "kernelbench")
    assert len(bench) >= 8 and all(p.name.endswith("_cpu.py") for p in bench)
    everything = script.task_paths("cpu", "all")
    assert everything[: len(everything) - len(bench)] == script.task_paths("cpu", "examples")
    assert {script.task_name(p) for p in everything} >= {"softmax", "19_ReLU_cpu"}


def test_a_win_is_confirmed_only_by_an_interval_above_one() -> None:
    script = _script()
    step = {"global": "g", "local": "l", "status": "improved", "speedup": 3.0, "correct": True}
    run = {
        "example": "t", "correct": True, "best_speedup": 3.0, "best_interval": [2.5, 3.5],
        "improved_steps": [1], "ref_speedup": 0.5, "start_ref_speedup": 0.2, "start_error": None,
        "steps": [step], "phase_seconds": [{}], "wall_s": 10.0, "best_source": "",
    }  # fmt: skip
    tie = {**run, "example": "u", "best_interval": [0.9, 1.2]}
    none = {**run, "example": "v", "improved_steps": [], "best_interval": None}
    out = {"device": "cpu", "steps": 1, "seed": 0, "runs": [run, tie, none]}
    out["summary"] = script.aggregate(out["runs"])
    assert out["summary"]["confirmed_wins"] == 1
    table = script.markdown(out)
    assert "3.00x (2.50-3.50)" in table and "| none |" in table
