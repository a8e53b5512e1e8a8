"""The example tasks under examples/ and running a candidate of one against its reference."""

from __future__ import annotations

import importlib.util
import itertools
import re
from pathlib import Path
from types import ModuleType

import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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


def naive_reference(start: Path) -> Path:
    """The KernelBench reference a naive start names on its first line."""
    line = start.read_text().splitlines()[0]
    match = re.fullmatch(r"# htam: reference=(\S+)", line)
    assert match, f"{start.name} names no reference"
    return start.parent / match.group(1)


def start_outputs(start: Path, source: str, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference output, output of `source` run as the implementation of `start`'s task)."""
    reference = load_module(naive_reference(start))
    candidate = tmp_path / "candidate.py"
    candidate.write_text(source)
    init = reference.get_init_inputs()
    torch.manual_seed(0)
    model = reference.Model(*init)
    torch.manual_seed(0)
    new = load_module(candidate).ModelNew(*init)
    torch.manual_seed(1)
    inputs = reference.get_inputs()
    with torch.no_grad():
        return model(*inputs), new(*inputs)


def check_start(start: Path, source: str, tmp_path: Path) -> None:
    """Run `source` as the implementation of `start`'s task and compare with PyTorch."""
    assert_close(*start_outputs(start, source, tmp_path))
