"""benchmarks/gpu_examples.py: skips cleanly without a GPU, measures speedup and CV with one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_examples.py"


def _run(tmp_path: Path, *args: str, timeout: int) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_why_and_exits_zero(tmp_path: Path) -> None:
    done, data = _run(tmp_path, "--quick", timeout=60)
    assert "torch.cuda.is_available() is False" in data["skipped"]
    assert done.stdout.startswith("GPU section skipped:")


@pytest.mark.gpu
def test_on_a_gpu_it_measures_speedup_and_timing_cv(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    done, data = _run(tmp_path, "--quick", "--steps", "1", timeout=480)
    assert data["wall_s"] < 480
    measured = [r for r in data["runs"] if "error" not in r]
    assert measured, data["runs"]
    for run in measured:
        assert len(run["repeats"]["runtimes_ms"]) + len(run["repeats"]["errors"]) == 5
        assert run["repeats"]["runtime_cv"] is None or run["repeats"]["runtime_cv"] >= 0
    assert "| runtime CV |" in done.stdout
