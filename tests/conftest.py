"""Hermetic tests: every test gets its own HTAM home, build and extension folders, and no
LLM credentials; the session fails if the user's real data dir changed while it ran."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hermetic import REAL_DATA_DIR, STRIPPED, snapshot

_BEFORE = snapshot(REAL_DATA_DIR)


@pytest.fixture(scope="session")
def machine_limits_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session keeps this machine's limits: measured once, by the first timed
    verdict that needs them (`htam_engine.roofline`), not once per test's home."""
    return tmp_path_factory.mktemp("machine") / "limits.json"


@pytest.fixture(autouse=True)
def hermetic_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine_limits_file: Path
) -> Iterator[Path]:
    """Point every HTAM folder of this test into its own tmp dir; strip LLM keys."""
    root = tmp_path / "hermetic"
    monkeypatch.setenv("HTAM_HOME", str(root / "home"))
    monkeypatch.setenv("HTAM_MACHINE_LIMITS", str(machine_limits_file))
    monkeypatch.setenv("HTAM_MACHINE_DIR", str(root / "machine"))  # where no file is named
    monkeypatch.setenv("HTAM_BUILD_DIR", str(root / "builds"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root / "torch-extensions"))
    monkeypatch.setenv("HTAM_KEEPER", "0")  # no judge kept past a test (its own tests aside)
    for name in STRIPPED:
        monkeypatch.delenv(name, raising=False)
    yield root


@pytest.fixture
def htam_home(hermetic_env: Path) -> Path:
    """This test's HTAM home, the folder `HTAM_HOME` points to (not created yet)."""
    return hermetic_env / "home"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test wrote into the user's real data dir."""
    changed = sorted(set(snapshot(REAL_DATA_DIR).items()) ^ set(_BEFORE.items()))
    if changed:
        names = sorted({name for name, _ in changed})
        print(f"\nTests changed the user's data dir {REAL_DATA_DIR}: {names[:10]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
