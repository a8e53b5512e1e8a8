"""On a CUDA GPU: the Triton examples and every rewrite of them compile, are correct at
the reference's sizes, and get timed (`pytest -m gpu -s tests/test_triton_gpu.py` prints
the table). Skipped where there is no GPU; interpreter runs are test_triton_interpreter's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.examples import EXAMPLES, assert_close, load_module
from helpers.skips import require
from helpers.triton import TRITON_IDS, TRITON_TASKS, chain

from htam_engine import triton_backend
from htam_engine.strategies import REGISTRY


def variants(task: str) -> dict[str, str]:
    """The naive start, each rewrite that applies to it, and the chain of all of them."""
    source = (EXAMPLES / task / "triton_naive.py").read_text()
    found = {"naive": source, "chain": chain(source)}
    found |= {
        rid: REGISTRY[rid].apply(source) for rid in TRITON_IDS if not REGISTRY[rid].check(source)
    }
    return found


def bench(model: torch.nn.Module, inputs: list[torch.Tensor]) -> float:
    """Milliseconds per call (triton.testing.do_bench: warm-up, L2 flush, CUDA events)."""
    import triton.testing

    return float(triton.testing.do_bench(lambda: model(*inputs)))


@pytest.mark.gpu
@pytest.mark.parametrize("task", TRITON_TASKS)
def test_triton_examples_and_rewrites_on_a_gpu(task: str, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    require(triton_backend.missing())
    assert not triton_backend.interpreted("cuda") and "TRITON_INTERPRET" not in os.environ
    reference = load_module(EXAMPLES / task / "reference.py")
    torch.manual_seed(0)
    inputs = [x.cuda() for x in reference.get_inputs()]
    model = reference.Model().cuda()
    with torch.no_grad():
        expected = model(*inputs)
        ref_ms = bench(model, inputs)
        for label, source in variants(task).items():
            path = tmp_path / f"{label.replace('.', '_')}.py"
            path.write_text(source)
            candidate = load_module(path).ModelNew().cuda()
            assert_close(expected, candidate(*inputs))
            ms = bench(candidate, inputs)
            print(
                f"{task:8s} {label:18s} {ms:8.4f} ms  torch {ref_ms:8.4f} ms  {ref_ms / ms:5.2f}x"
            )
