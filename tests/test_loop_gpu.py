"""The loop on a CUDA example, on a real GPU (offline provider: mechanical rewrites)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("example", ["gelu", "softmax"])
def test_cuda_loop_finds_a_correct_faster_kernel(example: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "htam_engine.cli",
            "optimize",
            str(ROOT / "examples" / example / "cuda_naive.py"),
            "--provider",
            "offline",
            "--device",
            "cuda",
            "--steps",
            "4",
            "--json",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    print(
        f"{example}: best {result['best_speedup']}x over start, {result['ref_speedup']}x vs torch"
    )
    assert result["correct"] is True
    assert result["start_verdict"]["device"] == "cuda"
    assert all(s["verdict"]["compiled"] for s in result["steps"])
    assert result["best_speedup"] >= 1.0
