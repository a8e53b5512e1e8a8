"""The CPU rewrites for one thread's critical path and passes (independent accumulators,
online softmax, one-pass moments, unroll pragmas, hoisted invariants) on real kernels:
each compiles with g++ and matches PyTorch alone and composed with cpu.vector_math, and
refuses, with its reason, what it must not touch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.examples import EXAMPLES, check_start, load_module, naive_reference
from helpers.skips import require

from htam_engine.strategies import REGISTRY

NAIVE = Path(__file__).resolve().parent / "fixtures" / "kernelbench" / "naive_cpu"
STARTS = sorted(NAIVE.glob("*_cpu.py"))
NEW = (
    "cpu.multi_accumulator",
    "cpu.online_softmax",
    "cpu.fuse_moments",
    "cpu.unroll",
    "cpu.hoist_invariants",
)


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def _applied(source: str, chain: tuple[str, ...]) -> str:
    for rid in chain:
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    return source


def _chains() -> list[tuple[Path, tuple[str, ...]]]:
    """Each new rewrite where it applies: alone, then vector_math, and after vector_math."""
    cases = []
    for start in STARTS:
        source = start.read_text()
        for rid in NEW:
            if REGISTRY[rid].check(source) is None:
                cases += [(start, (rid,)), (start, (rid, "cpu.vector_math"))]
            if REGISTRY[rid].check(_applied(source, ("cpu.vector_math",))) is None:
                cases.append((start, ("cpu.vector_math", rid)))
    return cases


@pytest.mark.parametrize(("start", "chain"), _chains(), ids=lambda v: getattr(v, "stem", v))
def test_rewritten_start_is_correct(start: Path, chain: tuple[str, ...], tmp_path: Path) -> None:
    source = _applied(start.read_text(), chain)
    assert source != start.read_text()
    check_start(start, source, tmp_path)


def _applies(rid: str, name: str) -> bool:
    return REGISTRY[rid].check((NAIVE / f"{name}_cpu.py").read_text()) is None


def test_the_rewrites_apply_where_they_should() -> None:
    assert _applies("cpu.multi_accumulator", "47_Sum_reduction_over_a_dimension")  # strided
    for name in ("40_LayerNorm", "24_LogSoftmax", "19_ReLU", "22_Tanh", "26_GELU_"):
        assert not _applies("cpu.multi_accumulator", name), name  # unit stride: simd's
    assert _applies("cpu.online_softmax", "24_LogSoftmax")
    assert _applies("cpu.fuse_moments", "40_LayerNorm")
    assert not _applies("cpu.online_softmax", "40_LayerNorm")
    assert not _applies("cpu.fuse_moments", "24_LogSoftmax")
    assert all(_applies("cpu.unroll", s.stem.removesuffix("_cpu")) for s in STARTS)
    assert _applies("cpu.hoist_invariants", "40_LayerNorm")
    assert not _applies("cpu.hoist_invariants", "19_ReLU")


def test_each_rewrite_refuses_its_own_output() -> None:
    for rid, name in [
        ("cpu.multi_accumulator", "47_Sum_reduction_over_a_dimension"),
        ("cpu.online_softmax", "24_LogSoftmax"),
        ("cpu.fuse_moments", "40_LayerNorm"),
        ("cpu.unroll", "19_ReLU"),
    ]:
        once = REGISTRY[rid].apply((NAIVE / f"{name}_cpu.py").read_text())
        assert REGISTRY[rid].check(once) is not None, rid


def _kernel(body: str) -> str:
    return (
        '#include <math.h>\nextern "C" void f(float* x, float* o, const float* scale, long n, '
        f"long r) {{\n    float s = 0.0f;\n    float m = x[0];\n    int k = 0;\n{body}\n    "
        "o[0] = s + m + k;\n}\n"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("for (long i = 0; i < n; ++i) { s = s * x[i] + 1.0f; }", "outer variable 's'"),
        ("for (long i = 0; i < n; ++i) { x[i + 1] = x[i] + 1.0f; s += x[i]; }", "another index"),
        ("for (long i = 0; i < n; ++i) { k += (int)x[i]; }", "integer"),
        ("#pragma omp simd reduction(+:s)\nfor (long i = 0; i < n; ++i) { s += x[i]; }", "simd"),
        ("for (long i = 0; i < n; ++i) { o[i] = x[i]; }", "reduces no outer scalar"),
        ("for (long i = 0; i <= n; ++i) { s += x[i]; }", "plain `<`"),
        ("for (long i = 0; i < n; ++i) { s += x[i] * scale[i]; }", "omp simd reduction"),
    ],
)
def test_multi_accumulator_refuses(body: str, reason: str) -> None:
    assert reason in str(REGISTRY["cpu.multi_accumulator"].check(_kernel(body)))


def _compile(source: str, tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    require(None if gxx else "g++ is not on PATH")
    assert gxx is not None
    path = tmp_path / "k.cpp"
    path.write_text(source)
    flags = ["-O2", "-fopenmp-simd", "-Wall", "-Werror", "-c", str(path), "-o", "k.o"]
    done = subprocess.run([gxx, *flags], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr


def test_multi_accumulator_splits_sums_and_maxima(tmp_path: Path) -> None:
    body = (
        "for (long i = 1; i < n; ++i) {\n    s += x[i * r] * x[i * r];\n"
        "    m = fmaxf(m, x[i * r]);\n}"
    )
    out = REGISTRY["cpu.multi_accumulator"].apply(_kernel(body))
    assert "float m_1 = m, m_2 = m, m_3 = m;" in out and "float s_1 = 0.0f" in out
    assert "long i = 1;\n    for (; i + 3 < n; i += 4) {" in out
    assert "s_3 += x[(i + 3) * r] * x[(i + 3) * r];" in out
    assert "s = (s + s_1) + (s_2 + s_3);" in out
    assert "for (; i < n; ++i)" in out  # the remainder
    _compile(out, tmp_path)


def test_online_softmax_refuses_a_sum_pass_that_stores() -> None:
    source = (EXAMPLES / "softmax" / "cpu_naive.py").read_text()
    assert "relative to the max" in str(REGISTRY["cpu.online_softmax"].check(source))


def test_online_softmax_rescales_the_running_sum() -> None:
    out = REGISTRY["cpu.online_softmax"].apply((NAIVE / "24_LogSoftmax_cpu.py").read_text())
    assert "if (m != m_old) s *= expf(m_old - m);" in out
    assert "for (long c_blk = 0; c_blk < cols; c_blk += 256)" in out


def test_fuse_moments_refuses_other_second_passes() -> None:
    source = (NAIVE / "40_LayerNorm_cpu.py").read_text()
    absolute = source.replace("var += d * d;", "var += fabsf(d);")
    assert "(v - mean) * (v - mean)" in str(REGISTRY["cpu.fuse_moments"].check(absolute))
    shifted = source.replace(
        "float d = x[r * cols + c] - mean;", "float d = x[r * cols + c + 1] - mean;"
    )
    assert REGISTRY["cpu.fuse_moments"].check(shifted) is not None


def _errors(start: Path, source: str, shift: float, tmp_path: Path) -> tuple[float, float]:
    """Max error against float64 of `source` and of PyTorch's fp32, inputs shifted by `shift`."""
    reference = load_module(naive_reference(start))
    candidate = tmp_path / f"candidate_{len(list(tmp_path.iterdir()))}.py"
    candidate.write_text(source)
    init = reference.get_init_inputs()
    model, new = reference.Model(*init), load_module(candidate).ModelNew(*init)
    torch.manual_seed(1)
    x = reference.get_inputs()[0] + shift
    with torch.no_grad():
        exact = model.double()(x.double())
        ours, theirs = new(x).double(), model.float()(x).double()
    return (ours - exact).abs().max().item(), (theirs - exact).abs().max().item()


@pytest.mark.parametrize("shift", [0.0, 100.0])
def test_fused_moments_are_as_exact_as_pytorch(shift: float, tmp_path: Path) -> None:
    """Sums in double keep the variance exact also when the mean is large next to the
    spread (the cancellation case), where the float passes of the start are not."""
    start = NAIVE / "40_LayerNorm_cpu.py"
    fused = REGISTRY["cpu.fuse_moments"].apply(start.read_text())
    ours, torch_error = _errors(start, fused, shift, tmp_path)
    assert ours <= 2 * torch_error, (ours, torch_error)


@pytest.mark.parametrize("shift", [0.0, 100.0])
def test_online_softmax_is_as_exact_as_its_start(shift: float, tmp_path: Path) -> None:
    start = NAIVE / "24_LogSoftmax_cpu.py"
    fused = REGISTRY["cpu.online_softmax"].apply(start.read_text())
    ours, _ = _errors(start, fused, shift, tmp_path)
    unfused, _ = _errors(start, start.read_text(), shift, tmp_path)
    assert ours <= 2 * unfused, (ours, unfused)


def test_unroll_leaves_simd_loops_and_makes_way_for_them(tmp_path: Path) -> None:
    body = "#pragma omp simd reduction(+:s)\nfor (long i = 0; i < n; ++i) { s += x[i]; }"
    assert "omp simd" in str(REGISTRY["cpu.unroll"].check(_kernel(body)))
    unrolled = REGISTRY["cpu.unroll"].apply(_kernel("for (long i = 0; i < n; ++i) { s += x[i]; }"))
    assert "#pragma GCC unroll 4\nfor (long i" in unrolled
    simd = REGISTRY["cpu.omp_simd"].apply(unrolled)
    assert "GCC unroll" not in simd and "#pragma omp simd reduction(+:s)" in simd
    _compile(simd, tmp_path)


def test_hoist_moves_invariants_and_loads_only_without_stores(tmp_path: Path) -> None:
    body = (
        "for (long i = 0; i < n; ++i) { o[r * n + i] = x[r * n + i] * *scale / sqrtf(m + 1.0f); }\n"
        "for (long i = 0; i < n; ++i) { s += x[i] * *scale + x[r * n]; }"
    )
    out = REGISTRY["cpu.hoist_invariants"].apply(_kernel(body))
    assert "const auto inv = sqrtf(m + 1.0f);" in out
    assert "o[r * n + i] = x[r * n + i] * *scale / inv;" in out  # o may alias scale
    assert "const auto inv1 = *scale;" in out and "const auto inv2 = x[r * n];" in out
    assert "s += x[i] * inv1 + inv2;" in out
    _compile(out, tmp_path)
    index = _kernel("for (long i = 0; i < n; ++i) { o[r * n + i] = x[i] + (float)(n / r); }")
    assert "no loop-invariant" in str(REGISTRY["cpu.hoist_invariants"].check(index))
