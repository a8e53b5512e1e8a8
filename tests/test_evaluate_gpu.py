"""CUDA candidates on a real GPU: correctness, repeatability, naive vs tiled matmul.

Run where a GPU is reachable with `pytest -m gpu -s tests/test_evaluate_gpu.py`; the
measured numbers are printed (and nothing measured is asserted as a constant).
"""

import statistics
from pathlib import Path

import pytest

from htam_engine.evaluate import evaluate
from htam_engine.machine import gpu_present
from htam_engine.task import load_task

MATMUL = Path(__file__).parent / "fixtures" / "eval" / "matmul"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (none reported)"),
]


def run(name: str, use_cache: bool = True):
    task = load_task(MATMUL / name)
    assert task.impl_source is not None
    return evaluate(task, task.impl_source, use_cache=use_cache)


def test_tiled_beats_naive_and_both_are_correct():
    naive, tiled = run("naive.py"), run("tiled.py")
    for verdict in (naive, tiled):
        assert verdict.error is None, verdict.error
        assert verdict.device == "cuda" and verdict.correct and verdict.inputs_checked == 3
    assert naive.runtime_ms and tiled.runtime_ms and naive.speedup and tiled.speedup
    print(
        f"\nnaive {naive.runtime_ms:.4f} ms ({naive.speedup:.3f}x vs torch), "
        f"tiled {tiled.runtime_ms:.4f} ms ({tiled.speedup:.3f}x vs torch), "
        f"tiled over naive {naive.runtime_ms / tiled.runtime_ms:.3f}x"
    )
    assert tiled.runtime_ms < naive.runtime_ms
    assert {"sm_clock_mhz", "mem_clock_mhz"} <= set(tiled.load), tiled.load  # conditions


def test_repeated_evaluations_agree():
    medians = []
    for _ in range(5):
        verdict = run("tiled.py", use_cache=False)
        assert verdict.correct and verdict.runtime_ms, verdict.error
        medians.append(verdict.runtime_ms)
    cv = statistics.stdev(medians) / statistics.mean(medians)
    print(f"\ntiled over 5 evaluations: median {statistics.median(medians):.4f} ms, CV {cv:.4f}")
    assert cv < 0.2


def test_bound_cu_file_runs_through_its_entry():
    verdict = run("tiled.cu")
    assert verdict.error is None, verdict.error
    assert verdict.correct and verdict.speedup
