"""The tests' own guard: no test reaches the user's data dir or an LLM key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REAL_DATA_DIR, STRIPPED, snapshot


def test_htam_folders_point_into_the_test(hermetic_env: Path) -> None:
    from htam_engine import paths

    assert paths.home().is_relative_to(hermetic_env)
    for name in ("HTAM_BUILD_DIR", "TORCH_EXTENSIONS_DIR"):
        assert Path(os.environ[name]).is_relative_to(hermetic_env)
    assert not any(os.environ.get(name) for name in STRIPPED)


def test_a_real_cli_run_writes_only_into_the_test_home(hermetic_env: Path) -> None:
    before = snapshot(REAL_DATA_DIR)
    proc = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "memory", "show", "--backend", "cpu", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any((hermetic_env / "home").iterdir()), "the CLI wrote nothing where HTAM_HOME points"
    assert snapshot(REAL_DATA_DIR) == before
