"""benchmarks/bench_policy.py runs end to end on small sizes and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from htam_engine.memory import EVIDENCE_BOUND, load_seed

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_policy.py"


def test_bench_policy_writes_a_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "50", "3000", "--repeats", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("| evidence entries |")
    rows = json.loads(out.read_text())["rows"]
    assert [row["entries"] for row in rows] == [50, 3000]
    bound = 2 * EVIDENCE_BOUND * len(load_seed("cuda").locals)
    assert all(0 < row["htam_kept_evidence"] <= bound for row in rows)
    assert all(row["htam_us"] > 0 and row["flat_us"] > 0 for row in rows)


def test_bench_policy_refuses_bad_sizes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "must be positive" in result.stderr
