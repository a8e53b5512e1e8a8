"""CUDA compile checks with nvcc on a machine without a GPU."""

import shutil
from pathlib import Path

import pytest

from htam_engine.evaluate import evaluate
from htam_engine.evaluate.excerpt import line_from_log
from htam_engine.evaluate.nvcc import cuda_source, nvcc_check
from htam_engine.machine import gpu_present
from htam_engine.task import load_task

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
KERNEL = """__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def test_valid_kernel_compiles():
    checked = nvcc_check(KERNEL, timeout_s=120)
    assert checked.compiled and checked.status == "compiled", checked.log


def test_broken_kernel_reports_the_line():
    broken = KERNEL.replace("2.0f * x[i];", "2.0f * x[i]\n    return undeclared;")
    checked = nvcc_check(broken, timeout_s=120)
    assert checked.status == "rejected" and "error" in checked.log
    assert line_from_log(checked.log, broken) == 4  # nvcc reports the statement after the gap


def test_nvcc_over_its_limit_is_a_timeout_not_a_rejection():
    checked = nvcc_check(KERNEL, timeout_s=0.01)
    assert checked.status == "timeout" and not checked.compiled
    assert "over its limit" in checked.log


def test_cuda_source_found_inside_a_load_inline_candidate():
    source = (FIXTURES / "matmul" / "tiled.py").read_text()
    code = cuda_source(source, "py")
    assert code is not None and "__global__ void matmul_tiled" in code


@pytest.mark.skipif(gpu_present(), reason="checks the no-GPU path; this machine has a GPU")
def test_cuda_task_without_gpu_is_compile_checked_then_no_gpu(tmp_path):
    (tmp_path / "reference.py").write_text((FIXTURES / "reference.py").read_text())
    kernel = tmp_path / "scale.cu"
    kernel.write_text("// htam: reference=reference.py entry=scale\n" + KERNEL)
    task = load_task(kernel)
    verdict = evaluate(task, kernel.read_text(), use_cache=False)
    assert verdict.device == "cuda" and verdict.compiled
    assert verdict.error is not None and verdict.error.kind == "no_gpu"
