"""CUDA rewrites checked for meaning without a GPU: the example kernels, before and after
each rewrite, run on the CPU under an emulation of the launch grid (helpers/emulation.py)
and must match the PyTorch reference. The real-GPU check is the `gpu`-marked test in
test_examples_cuda.py."""

from __future__ import annotations

import pytest
import torch
from helpers.emulation import emulated, launcher
from helpers.examples import EXAMPLES, TASKS, assert_close, load_module

from htam_engine import parsing
from htam_engine.kernels import load_cpp
from htam_engine.strategies import REGISTRY

CODE_IDS = sorted(r for r, w in REGISTRY.items() if w.backend == "cuda" and r != "cuda.fast_math")


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
    launch = launcher(load_cpp(task, emulated(kernel), ["-O2"]), kernel)
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
