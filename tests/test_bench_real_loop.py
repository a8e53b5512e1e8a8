"""benchmarks/real_loop.py: the real `htam optimize` subprocess, summarized per phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
