"""Hermetic tests: every test gets its own HTAM home, build and extension folders, and no
LLM credentials; the session fails if the user's real data dir changed while it ran."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Variables that would make a test reach a real LLM, read a user's cassette, or price calls
# with a user's table. Tests that need one set it themselves.
STRIPPED = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "HTAM_LLM_BASE_URL",
    "HTAM_LLM_MODEL",
    "HTAM_CASSETTE",
    "HTAM_PRICES",
)


def real_data_dir() -> Path:
    """The data dir HTAM would use without `HTAM_HOME` (what a user's runs write into)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("htam", appauthor=False))


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


REAL_DATA_DIR = real_data_dir()
_BEFORE = snapshot(REAL_DATA_DIR)


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point every HTAM folder of this test into its own tmp dir; strip LLM keys."""
    root = tmp_path / "hermetic"
    monkeypatch.setenv("HTAM_HOME", str(root / "home"))
    monkeypatch.setenv("HTAM_BUILD_DIR", str(root / "builds"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root / "torch-extensions"))
    for name in STRIPPED:
        monkeypatch.delenv(name, raising=False)
    yield root


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test wrote into the user's real data dir."""
    changed = sorted(set(snapshot(REAL_DATA_DIR).items()) ^ set(_BEFORE.items()))
    if changed:
        names = sorted({name for name, _ in changed})
        print(f"\nTests changed the user's data dir {REAL_DATA_DIR}: {names[:10]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def require(problem: str | None) -> None:
    """Skip a test whose toolchain is missing, naming why; in CI (`CI=true`) fail instead,
    so a broken setup can never pass as a run of skips."""
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI has no excuse to skip: {problem}")
    pytest.skip(problem)
