"""Triton in the one kernel model: `@triton.jit` functions are kernel units, their tags
come from the source, and a Triton file is a task of the `triton` backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.examples import EXAMPLES

from htam_engine import parsing
from htam_engine.task import guess_backend, load_task
from htam_engine.vocabulary import FEATURE_TAGS, state_tags

TRITON_EXAMPLES = sorted(EXAMPLES.glob("*/triton_naive.py"))
NAIVE_TAGS = {"masked", "no_autotune", "default_warps", "default_stages", "no_block_ptr"}

TUNED = """
import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=4)],
    key=["M", "N", "K"],
)
@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = tl.swizzle2d(tl.program_id(0), tl.program_id(1), M, N, GROUP_M)
    a_blk = tl.make_block_ptr(a_ptr, (M, K), (K, 1), (pid_m, 0), (BLOCK_M, BLOCK_K), (1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for tile in range(tl.program_id(0), 64, tl.num_programs(0)):
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_blk, boundary_check=(0, 1), eviction_policy="evict_last")
            acc = tl.dot(a, a, acc)
            a_blk = tl.advance(a_blk, (0, BLOCK_K))
    tl.atomic_add(c_ptr, acc.to(tl.float16))


@triton.jit
def scale(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2)
"""


@pytest.mark.parametrize("path", TRITON_EXAMPLES, ids=lambda p: p.parent.name)
def test_triton_examples_are_kernel_units_with_their_launchers(path: Path) -> None:
    data = path.read_bytes()
    units = parsing.kernels(data, "python")
    (kernel,) = [u for u in units if u.kind == "triton"]
    assert kernel.is_kernel and kernel.language == "python"
    assert kernel.name == f"{path.parent.name}_kernel" and kernel.launchers == ("forward",)
    assert data[kernel.name_start : kernel.name_end] == kernel.name.encode()
    assert data[kernel.start_byte : kernel.end_byte].startswith(b"@triton.jit\ndef ")
    assert {u.name for u in units} == {kernel.name, "ModelNew"}


@pytest.mark.parametrize("path", TRITON_EXAMPLES, ids=lambda p: p.parent.name)
def test_triton_example_tags_are_vocabulary_and_naive(path: Path) -> None:
    tags = parsing.features(path.read_text(), "triton")
    assert tags <= FEATURE_TAGS["triton"] <= state_tags("triton")
    assert tags >= NAIVE_TAGS
    matmul = {"tl_dot", "ieee_dot", "k_loop", "no_grouping"}
    assert tags & matmul == (matmul if path.parent.name == "matmul" else set())


def test_tags_of_a_tuned_triton_file() -> None:
    tags = parsing.features(TUNED, "triton")
    assert tags == {
        "masked", "block_ptr", "eviction_hints", "tl_dot", "tf32_dot", "k_loop", "loops",
        "nested_loops", "persistent", "autotune", "num_warps_set", "num_stages_set",
        "grouped_ordering", "atomics", "half_precision", "multiple_kernels",
    }  # fmt: skip
    assert tags <= FEATURE_TAGS["triton"]


def test_tags_of_one_kernel_text_as_the_editor_slices_it() -> None:
    (unit,) = [u for u in parsing.kernels(TUNED, "python") if u.name == "scale"]
    fragment = TUNED.encode()[unit.start_byte : unit.end_byte]
    assert parsing.features(fragment, "triton") == {
        "unmasked", "no_block_ptr", "no_autotune", "default_warps", "default_stages",
    }  # fmt: skip


def test_only_triton_jit_counts_as_a_triton_kernel() -> None:
    numba = "from numba import jit\n\n@jit\ndef f(x):\n    return x\n"
    assert parsing.kernels(numba, "python") == []
    assert parsing.features(numba, "triton") == set()
    imported = "from triton import jit\n\n@jit(debug=True)\ndef k(x_ptr):\n    pass\n"
    (unit,) = parsing.kernels(imported, "python")
    assert (unit.name, unit.kind, unit.launchers) == ("k", "triton", ())
    nested = "import triton\nclass Ops:\n    @triton.jit\n    def k(x):\n        pass\n"
    assert [u.name for u in parsing.kernels(nested, "python")] == ["k"]


def test_a_triton_file_is_a_triton_task() -> None:
    for path in TRITON_EXAMPLES:
        task = load_task(path)
        assert task.backend == "triton" and task.kind == "py"
        assert task.reference_path == path.parent / "reference.py"
    assert guess_backend("py", "import triton\n# @triton.jit in a comment\n") == "cpu"
    cuda = (EXAMPLES / "gelu" / "cuda_naive.py").read_text()
    assert guess_backend("py", cuda) == "cuda"
    assert guess_backend("cu", TUNED) == "cuda"


def test_grid_arithmetic_is_not_the_operator() -> None:
    """`triton.cdiv(m, BM) * triton.cdiv(n, BN)` in a grid function is no elementwise op:
    a Triton start says nothing of its family (as the CUDA and C++ ones), the reference does."""
    for path in TRITON_EXAMPLES:
        assert parsing.family(path.read_text()) == "unknown"
    forward = "        def grid(meta):\n            return ((x @ x).numel(),)\n"
    source = (
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        f"{forward}        k[lambda meta: (torch.sum(x),)](x)\n        return torch.relu(x)\n"
    )
    assert parsing.family(source) == "elementwise"
