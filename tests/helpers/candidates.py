"""Running a fixture candidate through the trusted side, in either sandbox mode."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from htam_engine.evaluate import Limits
from htam_engine.evaluate.runner import run_candidate
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Verdict
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent.parent / "fixtures"
CANDIDATES = FIXTURES / "candidates"
QUICK = Limits(compile_s=60, verify_s=30, time_s=60)
MODES = ("bwrap", "none")


def measure(
    path: Path, source: str | None = None, limits: Limits = QUICK, allow_torch: tuple[str, ...] = ()
) -> Verdict:
    """The candidate at `path` through everything after the static checks (the trusted
    side must hold on its own when a candidate evades them), torch allowed `allow_torch`."""
    task = replace(load_task(path), allow_torch=allow_torch)
    source = source if source is not None else path.read_text()
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    return run_candidate(task, source, verdict, limits, threading.Event(), lambda _p: None)


def failed(verdict: Verdict) -> list[str]:
    return [check.name for check in verdict.checks if not check.passed]


@contextlib.contextmanager
def sandboxed(mode: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Evaluations in this block run with the sandbox `mode` (`bwrap` skips where
    bubblewrap is not installed; `none` is the fallback, forced)."""
    if mode == "bwrap":
        if shutil.which("bwrap") is None:
            pytest.skip("bwrap is not installed")
        monkeypatch.delenv("HTAM_SANDBOX", raising=False)
    else:
        monkeypatch.setenv("HTAM_SANDBOX", "none")
    sandbox_mode.cache_clear()
    try:
        assert sandbox_mode() == mode, f"the sandbox {mode!r} does not start here"
        yield
    finally:
        sandbox_mode.cache_clear()
