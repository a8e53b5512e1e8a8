"""CUDA rewrites for real: every rewritten example kernel still compiles with
`nvcc -arch=sm_80 -c` (the kernels live in their own string, free of torch headers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cuda import NVCC, kernel_sources, nvcc_compile
from helpers.examples import EXAMPLES, TASKS

from htam_engine.strategies import REGISTRY

CUDA_IDS = sorted(rid for rid, rw in REGISTRY.items() if rw.backend == "cuda")
# fast_math only edits the flags list, the kernel text is unchanged.
APPLICABLE = [
    (rid, task)
    for rid in CUDA_IDS
    for task in TASKS
    if rid != "cuda.fast_math"
    and REGISTRY[rid].check((EXAMPLES / task / "cuda_naive.py").read_text()) is None
]

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


@pytest.mark.parametrize(("rid", "task"), APPLICABLE)
def test_rewritten_kernels_compile(rid: str, task: str, tmp_path: Path) -> None:
    source = (EXAMPLES / task / "cuda_naive.py").read_text()
    (kernel,) = kernel_sources(REGISTRY[rid].apply(source))
    result = nvcc_compile(kernel, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("task", TASKS)
def test_chained_rewrites_compile(task: str, tmp_path: Path) -> None:
    source = (EXAMPLES / task / "cuda_naive.py").read_text()
    for rid in CUDA_IDS:
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    assert "--use_fast_math" in source
    (kernel,) = kernel_sources(source)
    result = nvcc_compile(kernel, tmp_path)
    assert result.returncode == 0, result.stderr
