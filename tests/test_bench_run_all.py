"""benchmarks/run_all.py: one command, one results.json and one results.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py"


def test_quick_sections_write_json_and_markdown(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seed", "3", "--out", str(tmp_path),
         "--only", "simulation", "gpu_examples", "bench_policy"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["quick"] and result["seed"] == 3
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["torch"]
    sections = result["sections"]
    assert list(sections) == ["simulation", "gpu_examples", "bench_policy"]
    assert all(s["status"] == "ok" for s in sections.values()), sections
    assert sections["simulation"]["data"]["seed"] == 3  # the seed reaches every section
    assert "--seed" in sections["bench_policy"]["command"]
    repo = str(SCRIPT.parents[1])
    commands = [arg for s in sections.values() for arg in s["command"]]
    assert not [arg for arg in commands if arg.startswith(repo)], "commands name this machine"
    report = (tmp_path / "results.md").read_text()
    assert "## Policy quality in simulation" in report and "| htam |" in report
    assert "| evidence entries |" in report  # bench_policy's own table, taken from stdout


def test_unknown_section_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "nope", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "invalid choice" in done.stderr and "Traceback" not in done.stderr
