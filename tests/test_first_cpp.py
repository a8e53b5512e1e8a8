"""The mechanical first version (`htam_engine.translate`): real KernelBench problems at
CPU sizes, written as naive C++, compiled with load_cpp and compared with the reference
at the problem's sizes and at odd ones (sizes are read from the tensors at run time)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from htam_engine.translate import CannotTranslate, first_cpp

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "tests" / "fixtures" / "kernelbench" / "first_cpp"
WRITTEN = [
    "level1_21_Sigmoid.py",  # elementwise
    "level1_26_GELU_.py",
    "level1_29_Softplus.py",
    "level1_47_Sum_reduction_over_a_dimension.py",  # reductions
    "level1_51_Argmax_over_a_dimension.py",
    "level1_89_cumsum.py",
    "level1_36_RMSNorm_.py",  # norms
    "level1_94_MSELoss.py",  # losses
    "level1_3_Batched_matrix_multiplication.py",  # matmuls
    "level2_12_Gemm_Multiply_LeakyReLU.py",
    "level2_33_Gemm_Scale_BatchNorm.py",
    "level2_30_Gemm_GroupNorm_Hardtanh.py",
    "level1_42_Max_Pooling_2D.py",  # pooling
    "level1_45_Average_Pooling_2D.py",
    "level2_1_Conv2D_ReLU_BiasAdd.py",  # convolution
]


def _module(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def _resized(source: str, size: int) -> str:
    """Every module-level size of 16 (the fixtures' largest) made `size`."""
    return re.sub(r"(?m)^(\w+) = 16$", rf"\1 = {size}", source)


def _same(reference_source: str, written: str, seed: int) -> bool:
    reference = _module(reference_source, "reference")
    candidate = _module(written, "candidate")
    init = reference.get_init_inputs()
    torch.manual_seed(seed)
    model = reference.Model(*init)
    torch.manual_seed(seed)
    new = candidate.ModelNew(*init)
    inputs = reference.get_inputs()
    with torch.no_grad():
        expected, got = model(*inputs), new(*inputs)
    return (
        expected.shape == got.shape
        and expected.dtype == got.dtype
        and torch.allclose(expected, got, atol=1e-4, rtol=1e-4)
    )


@pytest.mark.parametrize("name", WRITTEN)
def test_a_written_first_version_matches_the_reference_at_its_sizes_and_odd_ones(
    name: str,
) -> None:
    source = (PROBLEMS / name).read_text()
    written = first_cpp(source, name)
    assert "class ModelNew" in written and 'extern "C"' in written
    assert _same(source, written, seed=0)
    assert _same(_resized(source, 11 if "GroupNorm" not in name else 12), written, seed=1)


def test_a_nan_constant_is_written_as_python() -> None:
    """torch's xlogy (KL divergence) fills a NaN; `repr` would write the undefined `nan`."""
    name = "level1_98_KLDivLoss.py"
    source = (PROBLEMS / name).read_text()
    written = first_cpp(source, name)
    assert "float('nan')" in written
    assert _same(source, written, seed=0)


def test_sizes_are_never_written_into_the_cpp() -> None:
    source = _resized((PROBLEMS / "level2_12_Gemm_Multiply_LeakyReLU.py").read_text(), 37)
    written = first_cpp(source, "gemm.py")
    cpp = written.split('r"""', 1)[1].split('"""', 1)[0]
    assert "37" not in cpp
    assert "for (long k = 0; k < K; ++k)" in cpp  # the sizes are the function's arguments


def test_an_op_htam_cannot_write_is_named() -> None:
    name = "level1_95_CrossEntropyLoss.py"
    with pytest.raises(CannotTranslate, match=r"cannot yet write a first version for aten\.gather"):
        first_cpp((PROBLEMS / name).read_text(), name)


def test_optimize_offline_starts_a_bare_problem_from_the_written_version(tmp_path: Path) -> None:
    task = tmp_path / "relu.py"
    shutil.copy(PROBLEMS / "level1_21_Sigmoid.py", task)
    done = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "optimize", str(task), "--json",
         "--provider", "offline", "--steps", "1", "--device", "cpu",
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert "error" not in result, result
    translation = result["translation"]
    assert translation["verdict"]["correct"] is True
    assert "naive C++ from the reference" in translation["reason"]


def test_optimize_offline_names_the_op_it_cannot_write(tmp_path: Path) -> None:
    task = tmp_path / "cross_entropy.py"
    shutil.copy(PROBLEMS / "level1_95_CrossEntropyLoss.py", task)
    done = subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "optimize", str(task), "--json",
         "--provider", "offline", "--steps", "1", "--device", "cpu"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    error = json.loads(done.stdout)["error"]
    assert done.returncode == 2
    assert error["kind"] == "no_start" and "aten.gather" in error["message"]
