"""A reference that fails is `reference_error`, not the candidate's failure: `htam eval`
says so, `htam optimize` stops at once (learning nothing) with that kind, and the sweep's
table names it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from htam_engine import sweep

FIXTURES = Path(__file__).parent / "fixtures" / "reference_error"
CANDIDATE = FIXTURES / "candidate.py"


def _htam(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "htam_engine.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_reference_whose_forward_raises_is_a_reference_error(tmp_path: Path) -> None:
    done = _htam("eval", str(CANDIDATE), str(CANDIDATE), "--device", "cpu", "--json", cwd=tmp_path)
    verdict = json.loads(done.stdout)
    assert verdict["error"]["kind"] == "reference_error", verdict["error"]
    assert "mat1 and mat2 shapes cannot be multiplied" in verdict["error"]["message"]
    assert not verdict["correct"] and done.returncode == 1


def test_optimize_stops_on_a_failing_reference_with_its_kind(tmp_path: Path) -> None:
    argv = ["optimize", str(CANDIDATE), "--provider", "offline", "--device", "cpu"]
    done = _htam(*argv, "--steps", "2", "--json", "--output", str(tmp_path / "out"), cwd=tmp_path)
    document = json.loads(done.stdout)  # exactly one JSON document: the error
    assert done.returncode == 2
    assert document["error"]["kind"] == "reference_error"
    assert "fix the reference first" in document["error"]["message"]
    result = sweep.ProblemResult.from_run(
        sweep.Problem(1, 7, "Broken", CANDIDATE), document, wall_s=1.0
    )
    assert result.status == "reference_error" and not result.correct
    table = sweep.markdown({"metrics": sweep.metrics([result]), "wall_s": 1.0,
                            "problems": [result.__dict__]})  # fmt: skip
    assert "| level1/7_Broken | reference_error |" in table
