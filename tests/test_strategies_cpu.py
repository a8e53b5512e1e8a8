"""CPU rewrites for real: every rewritten example compiles with g++ and stays correct
against its PyTorch reference, alone and with all CPU rewrites chained."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.examples import EXAMPLES, TASKS, assert_close, run_candidate

from htam_engine import parsing
from htam_engine.strategies import REGISTRY

CPU_IDS = sorted(rid for rid, rw in REGISTRY.items() if rw.backend == "cpu")
APPLICABLE = [
    (rid, task)
    for rid in CPU_IDS
    for task in TASKS
    if REGISTRY[rid].check((EXAMPLES / task / "cpu_naive.py").read_text()) is None
]


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def check_candidate(task: str, source: str, tmp_path: Path) -> None:
    path = tmp_path / "candidate.py"
    path.write_text(source)
    assert_close(*run_candidate(task, path))


@pytest.mark.parametrize(("rid", "task"), APPLICABLE)
def test_rewritten_example_compiles_and_is_correct(rid: str, task: str, tmp_path: Path) -> None:
    source = (EXAMPLES / task / "cpu_naive.py").read_text()
    check_candidate(task, REGISTRY[rid].apply(source), tmp_path)


@pytest.mark.parametrize("task", TASKS)
def test_chained_rewrites_are_correct(task: str, tmp_path: Path) -> None:
    source = (EXAMPLES / task / "cpu_naive.py").read_text()
    # independent accumulators and unrolling are the scalar alternatives to a simd loop
    # (they refuse one): last, they leave the simd loops alone
    for rid in sorted(CPU_IDS, key=lambda rid: rid in ("cpu.multi_accumulator", "cpu.unroll")):
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    assert {"simd_pragma", "opt_O3", "restrict_pointers"} <= parsing.features(source, "cpu")
    check_candidate(task, source, tmp_path)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_raw_cpp_rewrites_compile_with_gxx(tmp_path: Path) -> None:
    source = parsing.embedded_sources((EXAMPLES / "matmul" / "cpu_naive.py").read_text())[0].text
    for rid in ("cpu.restrict", "cpu.loop_order", "cpu.omp_parallel_for", "cpu.omp_simd"):
        source = REGISTRY[rid].apply(source)
    path = tmp_path / "kernel.cpp"
    path.write_text(source)
    command = [
        "g++",
        "-O2",
        "-fopenmp",
        "-Wall",
        "-Werror",
        "-c",
        str(path),
        "-o",
        str(tmp_path / "k.o"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
