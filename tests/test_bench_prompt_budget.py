"""benchmarks/prompt_budget.py: HTAM's prompts stay bounded while flat retrieval grows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from htam_engine.memory import EVIDENCE_BOUND, load_seed

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "prompt_budget.py"


def test_htam_prompt_is_bounded_and_flat_prompt_grows(tmp_path: Path) -> None:
    out = tmp_path / "budget.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "40", "400", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    small, large = json.loads(out.read_text())["rows"]
    bound = 2 * EVIDENCE_BOUND * len(load_seed("cuda").locals)
    assert small["htam_kept_evidence"] <= large["htam_kept_evidence"] <= bound
    assert large["htam_total"] < 1.5 * small["htam_total"]
    assert large["flat_all"] > 5 * small["flat_all"]  # ten times the entries, all retrieved
    assert small["htam_total"] == small["htam_local_selection"] + small["htam_generation"]
    assert "| 400 |" in done.stdout


def test_non_positive_size_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--sizes must be positive" in done.stderr and "Traceback" not in done.stderr
