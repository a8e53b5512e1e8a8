"""The example tasks: each naive CPU start is correct against its PyTorch reference.

Also holds the helpers the strategy tests use to run rewritten candidates for real.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest
import torch

from htam_engine import parsing

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TASKS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "reference.py").exists())
_counter = itertools.count()


def load_module(path: Path) -> ModuleType:
    """Import a file under a fresh module name (candidates build at import time)."""
    spec = importlib.util.spec_from_file_location(f"htam_example_{next(_counter)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_candidate(task: str, candidate: Path, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference output, candidate output) on the task's inputs, same weights and seed."""
    reference = load_module(EXAMPLES / task / "reference.py")
    impl = load_module(candidate)
    init = reference.get_init_inputs()
    torch.manual_seed(seed)
    model = reference.Model(*init)
    torch.manual_seed(seed)
    new = impl.ModelNew(*init)
    torch.manual_seed(seed + 1)
    inputs = reference.get_inputs()
    originals = [x.clone() for x in inputs]
    with torch.no_grad():
        expected, actual = model(*inputs), new(*inputs)
    assert all(torch.equal(x, y) for x, y in zip(inputs, originals, strict=True))
    return expected, actual


def assert_close(expected: torch.Tensor, actual: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-3)


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def test_examples_cover_the_four_families() -> None:
    families = {parsing.family((EXAMPLES / t / "reference.py").read_text()) for t in TASKS}
    assert families == {"elementwise", "reduction", "matmul", "fused"}


@pytest.mark.parametrize("task", TASKS)
def test_example_has_its_files(task: str) -> None:
    for name in ("reference.py", "cpu_naive.py", "cuda_naive.py"):
        source = (EXAMPLES / task / name).read_text()
        assert not parsing.has_errors(source, "python"), name
    cpu = (EXAMPLES / task / "cpu_naive.py").read_text()
    assert cpu.splitlines()[0] == "# htam: reference=reference.py"
    assert [e.call for e in parsing.embedded_sources(cpu)] == ["load_cpp"]


@pytest.mark.parametrize("task", TASKS)
def test_naive_cpu_start_is_correct(task: str) -> None:
    expected, actual = run_candidate(task, EXAMPLES / task / "cpu_naive.py")
    assert_close(expected, actual)
