"""The hermetic test environment: what conftest strips and watches, and where a test that
needs a second HTAM home makes one."""

from __future__ import annotations

import os
from pathlib import Path

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


REAL_DATA_DIR = real_data_dir()


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def second_home(htam_home: Path, name: str) -> Path:
    """Another HTAM home beside the test's own (`htam_home`, conftest's fixture), for a test
    that compares two homes; it lives in the same tmp dir, so it is as hermetic."""
    return htam_home.parent / name


def environment_in(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with `HTAM_HOME` at `home`, for a subprocess that runs in a
    `second_home` (the only place outside conftest that points `HTAM_HOME` anywhere)."""
    return {**os.environ, "HTAM_HOME": str(home), **extra}
