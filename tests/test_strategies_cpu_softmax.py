"""cpu.fused_softmax: where it applies, and the fused kernel's numbers against PyTorch's
over the verifier's range (|x| up to 100, -inf entries, odd row lengths), with the AVX2
exp and with the scalar fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.examples import EXAMPLES, load_module

from htam_engine.strategies import REGISTRY
from htam_engine.vocabulary import TOLERANCES

NAIVE = Path(__file__).parent / "fixtures" / "kernelbench" / "naive_cpu"
FUSED = REGISTRY["cpu.fused_softmax"]
ROWS = {  # start -> the torch function its ModelNew computes over dim 1
    EXAMPLES / "softmax" / "cpu_naive.py": torch.softmax,
    NAIVE / "23_Softmax_cpu.py": torch.softmax,
    NAIVE / "24_LogSoftmax_cpu.py": torch.log_softmax,
}
TOL = TOLERANCES["float32"]


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def _inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(3, 4099, generator=gen) * 100.0  # exp's argument down to about -500
    holes = torch.randn(5, 2048, generator=gen)
    holes[:, ::7] = -torch.inf  # exp(-inf - m): 0
    holes[0, :] = -torch.inf
    holes[0, 3] = 1.0  # a row with one finite entry
    rising = torch.linspace(-50.0, 50.0, 3 * 8192 + 5).reshape(1, -1)  # the max grows per block
    tiny = torch.randn(4, 7, generator=gen)  # shorter than a vector
    return [wide, holes, rising, tiny]


def _check(path: Path, source: str, tmp_path: Path) -> None:
    candidate = tmp_path / f"{path.stem}_candidate.py"
    candidate.write_text(source)
    model = load_module(candidate).ModelNew()
    for x in _inputs():
        expected = ROWS[path](x.double(), 1).float()
        torch.testing.assert_close(model(x), expected, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("path", sorted(ROWS), ids=lambda p: p.stem)
def test_every_block_size_matches_pytorch(path: Path, tmp_path: Path) -> None:
    variants = FUSED.variants(path.read_text())
    assert FUSED.param is not None
    assert sorted(value for value, _ in variants) == sorted(FUSED.param.values)
    for _, source in variants:
        assert "htam_exp8" in source and '"-march=native"' in source
        _check(path, source, tmp_path)


@pytest.mark.parametrize("path", sorted(ROWS), ids=lambda p: p.stem)
def test_the_scalar_fallback_matches_pytorch(path: Path, tmp_path: Path) -> None:
    source = FUSED.apply(path.read_text()).replace('"-march=native"', '"-mno-avx2"')
    _check(path, source, tmp_path)


def test_it_applies_to_row_softmaxes_only() -> None:
    for path in ROWS:
        assert FUSED.check(path.read_text()) is None, path
    for other in ("gelu", "matmul", "linear_relu"):
        assert FUSED.check((EXAMPLES / other / "cpu_naive.py").read_text()) is not None
    layer_norm = (NAIVE / "40_LayerNorm_cpu.py").read_text()
    assert FUSED.check(layer_norm) is not None


def test_a_pass_that_divides_by_something_else_is_left_alone() -> None:
    source = (NAIVE / "23_Softmax_cpu.py").read_text()
    other = source.replace("out[r * cols + c] / s;", "out[r * cols + c] / (s + 1.0f);")
    assert other != source
    assert FUSED.check(other) is not None


def test_fusing_twice_is_refused() -> None:
    fused = FUSED.apply((EXAMPLES / "softmax" / "cpu_naive.py").read_text())
    assert FUSED.check(fused) is not None
