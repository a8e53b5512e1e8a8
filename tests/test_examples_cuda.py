"""The naive CUDA starts: their kernels compile with nvcc, and on a GPU they are correct."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cuda import NVCC, kernel_sources, nvcc_compile
from helpers.examples import EXAMPLES, TASKS, assert_close, load_module


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("task", TASKS)
def test_naive_cuda_kernels_compile(task: str, tmp_path: Path) -> None:
    sources = kernel_sources((EXAMPLES / task / "cuda_naive.py").read_text())
    assert len(sources) == 1
    result = nvcc_compile(sources[0], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS)
def test_naive_cuda_start_is_correct(task: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    reference = load_module(EXAMPLES / task / "reference.py")
    impl = load_module(EXAMPLES / task / "cuda_naive.py")
    init = reference.get_init_inputs()
    torch.manual_seed(0)
    model = reference.Model(*init).cuda()
    torch.manual_seed(0)
    new = impl.ModelNew(*init).cuda()
    inputs = [x.cuda() for x in reference.get_inputs()]
    with torch.no_grad():
        assert_close(model(*inputs), new(*inputs))
