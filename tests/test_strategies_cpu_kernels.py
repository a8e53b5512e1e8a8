"""The CPU strategy library on real kernels: vector math (libmvec really called), reductions
with max/min, branch-free selects, loop order and register blocking. Every rewrite that
applies to a naive KernelBench start compiles with g++ and matches its PyTorch reference."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.examples import EXAMPLES, check_start, naive_reference
from helpers.skips import require

from htam_engine import parsing
from htam_engine.kernels import build_cpp
from htam_engine.strategies import REGISTRY

NAIVE = Path(__file__).resolve().parent / "fixtures" / "kernelbench" / "naive_cpu"
STARTS = sorted(NAIVE.glob("*_cpu.py"))
NEW = ("cpu.vector_math", "cpu.branchless", "cpu.loop_order", "cpu.reciprocal", "cpu.register_tile")


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def test_there_are_eight_naive_kernelbench_starts() -> None:
    assert len(STARTS) >= 8
    assert all(naive_reference(s).exists() for s in STARTS)


@pytest.mark.parametrize("start", STARTS, ids=lambda p: p.stem)
def test_each_naive_start_is_correct(start: Path, tmp_path: Path) -> None:
    check_start(start, start.read_text(), tmp_path)


def _chains() -> list[tuple[Path, tuple[str, ...]]]:
    cases: list[tuple[Path, tuple[str, ...]]] = []
    for start in STARTS:
        source = start.read_text()
        applicable = tuple(rid for rid in NEW if REGISTRY[rid].check(source) is None)
        cases += [(start, (rid,)) for rid in applicable]
        cases.append((start, ("cpu.vector_math", "cpu.loop_order")))
    return cases


@pytest.mark.parametrize(("start", "chain"), _chains(), ids=lambda v: getattr(v, "stem", v))
def test_rewritten_start_is_correct(start: Path, chain: tuple[str, ...], tmp_path: Path) -> None:
    source = start.read_text()
    for rid in chain:
        if REGISTRY[rid].check(source) is None:
            source = REGISTRY[rid].apply(source)
    check_start(start, source, tmp_path)


def test_the_strategies_apply_where_they_should() -> None:
    def applies(rid: str, name: str) -> bool:
        return REGISTRY[rid].check((NAIVE / f"{name}_cpu.py").read_text()) is None

    for name in ("19_ReLU", "22_Tanh", "26_GELU_", "23_Softmax", "24_LogSoftmax", "40_LayerNorm"):
        assert applies("cpu.vector_math", name), name
    assert applies("cpu.branchless", "19_ReLU") and applies("cpu.branchless", "23_Softmax")
    assert applies("cpu.loop_order", "1_Square_matrix_multiplication_")
    assert applies("cpu.loop_order", "47_Sum_reduction_over_a_dimension")
    assert not applies("cpu.loop_order", "23_Softmax")


def _symbols(library: Path) -> str:
    nm = shutil.which("nm")
    require(None if nm else "nm (binutils) is not on PATH")
    assert nm is not None
    return subprocess.run([nm, "-D", str(library)], capture_output=True, text=True).stdout


@pytest.mark.parametrize(("task", "function"), [("gelu", "erff"), ("softmax", "expf")])
def test_vector_math_calls_libmvec(task: str, function: str) -> None:
    """The point of the compound: GCC calls glibc's vector variant (`_ZGVdN8v_erff`, or
    the AVX-512 one), where the pragma or the flags alone keep the scalar call."""
    source = (EXAMPLES / task / "cpu_naive.py").read_text()
    rewritten = REGISTRY["cpu.vector_math"].apply(source)
    (code,) = parsing.embedded_sources(rewritten)
    flags = parsing.python_source.flag_values(rewritten.encode(), "extra_cflags")
    assert {"-fopenmp-simd", "-fno-math-errno", "-O3", "-march=native"} <= set(flags)
    vector = re.compile(rf"_ZGV\w+_{function}\b")
    assert vector.search(_symbols(build_cpp(code.text, flags)))
    (plain,) = parsing.embedded_sources(source)
    assert not vector.search(_symbols(build_cpp(plain.text, flags)))
    assert REGISTRY["cpu.vector_math"].check(rewritten) is not None  # nothing left to do


def _simd_clause(body: str) -> str:
    code = f'#include <math.h>\nextern "C" void f(const float* x, float* o, long n) {{\n{body}\n}}'
    plan = REGISTRY["cpu.omp_simd"].apply(code)
    return next(line.strip() for line in plan.splitlines() if "#pragma omp simd" in line)


@pytest.mark.parametrize(
    ("update", "clause"),
    [
        ("m = fmaxf(m, x[i]);", "reduction(max:m)"),
        ("m = x[i] > m ? x[i] : m;", "reduction(max:m)"),
        ("m = (x[i] < m) ? x[i] : m;", "reduction(min:m)"),
        ("m = m < x[i] ? m : x[i];", "reduction(min:m)"),
        ("m *= x[i];", "reduction(*:m)"),
        ("m -= x[i];", "reduction(+:m)"),
    ],
)
def test_reductions_are_recognised(update: str, clause: str) -> None:
    body = f"float m = x[0];\nfor (long i = 0; i < n; ++i) {{ {update} }}\no[0] = m;"
    assert _simd_clause(body) == f"#pragma omp simd {clause}"


@pytest.mark.parametrize("update", ["m = m + x[i] * m;", "m = x[i] > 0 ? x[i] : m;"])
def test_other_updates_of_an_outer_scalar_are_refused(update: str) -> None:
    code = f'extern "C" void f(const float* x, float* o, long n) {{ float m = 0; for (long i = 0; i < n; ++i) {{ {update} }} o[0] = m; }}'  # noqa: E501
    assert "outer variable 'm'" in str(REGISTRY["cpu.omp_simd"].check(code))


def test_simd_alone_refuses_a_scalar_libm_loop() -> None:
    source = (EXAMPLES / "gelu" / "cpu_naive.py").read_text()
    assert "erff" in str(REGISTRY["cpu.omp_simd"].check(source))


def test_branchless_selects() -> None:
    code = """extern "C" void f(const float* x, float* o, long n) {
    float m = x[0];
    for (long i = 0; i < n; ++i) {
        if (x[i] > 0.0f) { o[i] = x[i]; } else { o[i] = 0.0f; }
        if (x[i] > m) m = x[i];
        if (x[i] < 0.0f) o[i] = 1.0f;
    }
    o[0] = m;
}"""
    out = REGISTRY["cpu.branchless"].apply(code)
    assert "o[i] = (x[i] > 0.0f) ? (x[i]) : (0.0f);" in out
    assert "m = (x[i] > m) ? (x[i]) : (m);" in out
    assert "if (x[i] < 0.0f) o[i] = 1.0f;" in out  # an array store without else stays
    plain = 'extern "C" void f(float* o, long n) { for (long i = 0; i < n; ++i) o[i] = 1; }'
    assert REGISTRY["cpu.branchless"].check(plain) is not None


MATMUL = """extern "C" void mm(const float* a, const float* b, float* c, long M, long N, long K) {
    for (long i = 0; i < M; ++i) {
        for (long j = 0; j < N; ++j) {
            float acc = 0.0f;
            for (long k = 0; k < K; ++k) {
                acc += a[i * K + k] * B_INDEX;
            }
            c[i * N + j] = acc;
        }
    }
}"""


def test_loop_order_follows_the_layout() -> None:
    row_major = REGISTRY["cpu.loop_order"].apply(MATMUL.replace("B_INDEX", "b[k * N + j]"))
    assert re.search(r"k \+= 4\) \{\n\s*#pragma omp simd\n\s*for \(long j", row_major)
    assert (
        "c[i * N + j] = c[i * N + j] + (a[i * K + (k + 0)] * b[(k + 0) * N + j]) + (" in row_major
    )
    weight = REGISTRY["cpu.loop_order"].apply(MATMUL.replace("B_INDEX", "b[j * K + k]"))
    assert "reduction(+:acc_0, acc_1, acc_2, acc_3)" in weight and "j += 4" in weight
    strided = MATMUL.replace("B_INDEX", "b[k * N + j * K]")
    assert "neither" in str(REGISTRY["cpu.loop_order"].check(strided))
    reads_out = MATMUL.replace("B_INDEX", "c[i * N + j]")
    assert "output is read" in str(REGISTRY["cpu.loop_order"].check(reads_out))


@pytest.mark.parametrize("form", ["dot", "perfect", "weight"])
def test_the_register_tile_is_exact_on_ragged_sizes(form: str) -> None:
    """Full tiles and both edges (sizes no tile divides), in both nest forms and with an
    (N, K) weight packed first: each output sums its k terms in the original order, so the
    result equals the plain nest's."""
    code = MATMUL.replace("B_INDEX", "b[j * K + k]" if form == "weight" else "b[k * N + j]")
    if form == "perfect":
        code = code.replace("float acc = 0.0f;", "").replace("acc += ", "c[i * N + j] += ")
        code = code.replace("c[i * N + j] = acc;", "")
    tiled = REGISTRY["cpu.register_tile"].apply(code)
    assert "_tile[" in tiled and REGISTRY["cpu.register_tile"].check(tiled) is not None
    assert ("_packed" in tiled) == (form == "weight")
    flags = ["-O3", "-march=native", "-fopenmp-simd"]
    m, n, k = 37, 70, 29
    a, b = torch.randn(m, k), torch.randn(k, n)
    if form == "weight":
        b = b.t().contiguous()  # (N, K)
    outputs = []
    for source in (code, tiled):
        library = ctypes.CDLL(str(build_cpp(source, flags)))
        c = torch.zeros(m, n)
        library.mm(
            *(ctypes.c_void_p(t.data_ptr()) for t in (a, b, c)), *map(ctypes.c_long, (m, n, k))
        )
        outputs.append(c)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-6, atol=1e-5)
    expected = a @ (b.t() if form == "weight" else b)
    torch.testing.assert_close(outputs[1], expected, rtol=1e-4, atol=1e-4)


def test_the_register_tile_needs_an_operand_contiguous_in_j_or_k() -> None:
    strided = MATMUL.replace("B_INDEX", "b[k * N + j * K]")
    assert "neither" in str(REGISTRY["cpu.register_tile"].check(strided))
    for task in ("matmul", "linear_relu"):
        source = (EXAMPLES / task / "cpu_naive.py").read_text()
        assert REGISTRY["cpu.register_tile"].check(source) is None, task


def test_cache_block_waits_for_the_loop_order() -> None:
    source = (EXAMPLES / "matmul" / "cpu_naive.py").read_text()
    assert "loop order" in str(REGISTRY["cpu.cache_block"].check(source))
    assert REGISTRY["cpu.loop_order"].check(source) is None


@pytest.mark.parametrize("b_index", ["b[k * N + j]", "b[j * K + k]"])
def test_loop_order_rewrites_compile_cleanly(b_index: str, tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    require(None if gxx else "g++ is not on PATH")
    assert gxx is not None
    path = tmp_path / "mm.cpp"
    path.write_text(REGISTRY["cpu.loop_order"].apply(MATMUL.replace("B_INDEX", b_index)))
    command = [gxx, "-O2", "-fopenmp-simd", "-Wall", "-Werror", "-c", str(path), "-o", "mm.o"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr


def test_reciprocal_only_for_invariant_floating_divisors() -> None:
    code = """extern "C" void f(const float* x, float* o, long n, float s, int q) {
    float t = s * 2.0f;
    for (long i = 0; i < n; ++i) {
        float u = x[i];
        o[i] = x[i] / t / sqrtf(s) + x[i] / u + x[i] / q + i / 3 + u / (float)n;
    }
}"""
    out = REGISTRY["cpu.reciprocal"].apply(code)
    assert "const float rcp0 = 1.0f / (sqrtf(s));" in out
    assert "x[i] / t * rcp0" in out  # the inner division of a chain is left alone
    assert "x[i] / u" in out and "x[i] / q" in out and "i / 3" in out  # varying or integer
    again = REGISTRY["cpu.reciprocal"].apply(out)  # then the one left in the chain
    assert "const float rcp1 = 1.0f / (t);" in again and "x[i] * rcp1 * rcp0" in again
    assert REGISTRY["cpu.reciprocal"].check(again) is not None
