"""The tests' own guard: no test reaches the user's data dir or an LLM key."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from helpers.hermetic import REAL_DATA_DIR, STRIPPED, snapshot

TESTS = Path(__file__).resolve().parent


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


def _modules() -> list[Path]:
    return sorted([*TESTS.glob("*.py"), *(TESTS / "helpers").glob("*.py")])


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another_or_conftest() -> None:
    """Shared pieces live in tests/helpers/: a test module imported as a library runs its
    module-level setup twice under two names, and conftest is pytest's, not a library."""
    offenders = {
        path.name: sorted(
            n
            for n in _imported(ast.parse(path.read_text()))
            if n == "conftest" or n.startswith("test_")
        )
        for path in _modules()
    }
    assert not {name: found for name, found in offenders.items() if found}


def _sets_htam_home(node: ast.AST) -> bool:
    def home(n: ast.AST | None) -> bool:
        return isinstance(n, ast.Constant) and n.value == "HTAM_HOME"

    if isinstance(node, ast.Dict):  # an environment handed to a subprocess
        return any(home(key) for key in node.keys)
    if isinstance(node, ast.Call):  # monkeypatch.setenv / os.environ.setdefault
        return any(home(arg) for arg in node.args[:1]) and not (
            isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv")
        )
    if isinstance(node, ast.keyword):  # env.update(HTAM_HOME=...)
        return node.arg == "HTAM_HOME"
    if isinstance(node, ast.Assign):  # os.environ["HTAM_HOME"] = ...
        return any(isinstance(t, ast.Subscript) and home(t.slice) for t in node.targets)
    return False


def test_only_conftest_sets_htam_home() -> None:
    """Every test gets its home from conftest's `hermetic_env`; a second one, where a test
    compares two homes, comes from `helpers.hermetic.second_home` inside the same tmp dir."""
    setters = [
        path.name
        for path in _modules()
        if path.name not in ("conftest.py", "hermetic.py")  # the fixture; `environment_in`
        and any(_sets_htam_home(node) for node in ast.walk(ast.parse(path.read_text())))
    ]
    assert setters == []
