"""Skipping a test whose toolchain is missing, but never in CI."""

from __future__ import annotations

import os

import pytest


def require(problem: str | None) -> None:
    """Skip a test whose toolchain is missing, naming why; in CI (`CI=true`) fail instead,
    so a broken setup can never pass as a run of skips."""
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI has no excuse to skip: {problem}")
    pytest.skip(problem)
