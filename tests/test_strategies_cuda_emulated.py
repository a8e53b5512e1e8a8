"""CUDA rewrites checked for meaning without a GPU: the example kernels, before and after
each rewrite, run on the CPU under a sequential emulation of the launch grid (g++ and a
small shim for threadIdx/blockIdx/float4) and must match the PyTorch reference.

The emulation runs threads one after another, which is exact for these kernels: they
share no memory and never synchronise. The real-GPU check is the `gpu`-marked test in
test_examples_cuda.py."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pytest
import torch
from helpers.examples import EXAMPLES, TASKS, assert_close, load_module

from htam_engine import parsing
from htam_engine.kernels import load_cpp
from htam_engine.parsing import cxx_source
from htam_engine.strategies import REGISTRY
from htam_engine.strategies.base import apply_edits

SHIM = """\
#include <math.h>
struct htam_dim3 { unsigned x, y, z; };
static htam_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
#define __global__
#define __launch_bounds__(...)
template <class F> static void htam_launch(unsigned grid, unsigned block, F body) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        for (unsigned t = 0; t < block; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            body();
        }
    }
}
"""
CODE_IDS = sorted(r for r, w in REGISTRY.items() if w.backend == "cuda" and r != "cuda.fast_math")


def emulated(kernel_source: str) -> str:
    """The kernel source with each `k<<<g, b>>>(args)` turned into a sequential loop."""
    data = kernel_source.encode()
    edits = []
    for call in cxx_source.launches(parsing.parse(data, "cuda").root_node):
        grid, block = (parsing.text(n) for n in cxx_source.launch_config(call)[:2])
        name = parsing.text(call.child_by_field_name("function"))
        args = parsing.text(call.child_by_field_name("arguments"))
        edits.append(
            (
                call.start_byte,
                call.end_byte,
                f"htam_launch({grid}, {block}, [&] {{ {name}{args}; }})",
            )
        )
    body = apply_edits(data, edits).decode()
    return f'{SHIM}extern "C" {{\n{body}\n}}\n'


def _launcher(lib: ctypes.CDLL, source: str) -> Callable[..., None]:
    (host,) = [u for u in parsing.kernels(source, "cuda") if u.kind == "host"]
    root = parsing.parse(source, "cuda").root_node
    fn = next(f for f in cxx_source.functions(root) if cxx_source.function_name(f) == host.name)
    launch = getattr(lib, host.name)
    launch.argtypes = [
        ctypes.c_void_p if cxx_source.pointer_declarator(p) else ctypes.c_int
        for p in cxx_source.parameters(fn)
    ]
    return launch


def _arguments(
    task: str, model: torch.nn.Module, inputs: list[torch.Tensor], out: torch.Tensor
) -> list[int]:
    x = inputs[0]
    if task == "gelu":
        return [x.data_ptr(), out.data_ptr(), x.numel()]
    if task == "softmax":
        return [x.data_ptr(), out.data_ptr(), *x.shape]
    if task == "matmul":
        b = inputs[1]
        return [x.data_ptr(), b.data_ptr(), out.data_ptr(), x.shape[0], b.shape[1], x.shape[1]]
    linear = model.get_submodule("linear")
    assert isinstance(linear, torch.nn.Linear)
    w, bias = linear.weight, linear.bias
    return [
        x.data_ptr(),
        w.data_ptr(),
        bias.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        w.shape[0],
        x.shape[1],
    ]


def run_emulated(task: str, python_source: str) -> None:
    (kernel,) = [e.text for e in parsing.embedded_sources(python_source) if "__global__" in e.text]
    launch = _launcher(load_cpp(task, emulated(kernel), ["-O2"]), kernel)
    reference = load_module(EXAMPLES / task / "reference.py")
    torch.manual_seed(0)
    model = reference.Model(*reference.get_init_inputs())
    torch.manual_seed(1)
    inputs = [x.contiguous() for x in reference.get_inputs()]
    with torch.no_grad():
        expected = model(*inputs)
        out = torch.full_like(expected, float("nan"))
        launch(*_arguments(task, model, inputs, out))
    assert_close(expected, out)


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


@pytest.mark.parametrize("task", TASKS)
def test_naive_kernel_is_correct_under_emulation(task: str) -> None:
    run_emulated(task, (EXAMPLES / task / "cuda_naive.py").read_text())


APPLICABLE = [
    (rid, task)
    for rid in CODE_IDS
    for task in TASKS
    if REGISTRY[rid].check((EXAMPLES / task / "cuda_naive.py").read_text()) is None
]


@pytest.mark.parametrize(("rid", "task"), APPLICABLE)
def test_rewritten_kernel_is_correct_under_emulation(rid: str, task: str) -> None:
    run_emulated(task, REGISTRY[rid].apply((EXAMPLES / task / "cuda_naive.py").read_text()))


@pytest.mark.parametrize("task", TASKS)
def test_chained_kernel_is_correct_under_emulation(task: str) -> None:
    source = (EXAMPLES / task / "cuda_naive.py").read_text()
    for rid in CODE_IDS:
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    run_emulated(task, source)
