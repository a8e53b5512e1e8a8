"""Feature tags read off the syntax tree, one test per tag, on real code: a word in a
comment or a string is no feature, and an intrinsics kernel is never `no_simd`."""

from __future__ import annotations

from pathlib import Path

import pytest

from htam_engine import parsing

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
AVX2 = (FIXTURES / "llm" / "frontier_softmax_avx2.py").read_text()  # a real model's answer


def cpu(body: str, flags: str = '["-O2"]') -> set[str]:
    """Tags of `body` as the C++ source of a load_cpp file (flags as the file sets them)."""
    source = f'CPP = r"""\n{body}\n"""\n_lib = load_cpp("k", CPP, extra_cflags={flags})\n'
    return parsing.features(source, "cpu")


LOOP = 'extern "C" void f(const float* x, float* y, long n) {\n%s\n}'
AXPY = "for (long i = 0; i < n; ++i) y[i] = 2.0f * x[i];"


def test_the_intrinsics_kernel_is_tagged_intrinsics_and_vector_types_never_no_simd() -> None:
    tags = parsing.features(AVX2, "cpu")
    assert {"intrinsics", "vector_types", "march_native", "opt_O3"} <= tags
    assert "no_simd" not in tags
    naive = parsing.features((EXAMPLES / "softmax" / "cpu_naive.py").read_text(), "cpu")
    assert {"no_simd", "no_openmp", "no_restrict", "low_opt"} <= naive


@pytest.mark.parametrize(
    ("body", "tag"),
    [
        ("#pragma omp simd\n" + AXPY, "simd_pragma"),
        ("#pragma omp parallel for simd\n" + AXPY, "simd_pragma"),
        ("#pragma GCC ivdep\n" + AXPY, "simd_pragma"),
        ("#pragma omp parallel for\n" + AXPY, "openmp"),
        ("for (long i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_loadu_ps(x + i));",
         "intrinsics"),
        ("typedef float v8 __attribute__((vector_size(32)));\nv8 a = {};\n" + AXPY, "vector_types"),
        ("__m512 acc = {};\n" + AXPY, "vector_types"),
        ("for (long i = 0; i < n; ++i) { __builtin_prefetch(x + i + 64); y[i] = x[i]; }",
         "prefetch"),
    ],
)  # fmt: skip
def test_each_cpu_tag_comes_from_code(body: str, tag: str) -> None:
    tags = cpu(LOOP % body)
    assert tag in tags
    assert ("no_simd" in tags) == (tag in ("openmp", "prefetch"))


@pytest.mark.parametrize(
    "body",
    [
        "// #pragma omp parallel for\n// _mm256_loadu_ps(x) __builtin_prefetch(x)\n" + AXPY,
        'const char* s = "#pragma omp simd _mm256_add_ps __m256";\n' + AXPY,
    ],
)
def test_words_in_comments_and_strings_are_no_features(body: str) -> None:
    tags = cpu(LOOP % body)
    assert {"no_openmp", "no_simd"} <= tags
    assert not {"openmp", "simd_pragma", "intrinsics", "vector_types", "prefetch"} & tags


def test_restrict_blocked_loops_and_fast_math() -> None:
    blocked = (
        'extern "C" void f(const float* __restrict__ x, float* __restrict__ y, long n) {\n'
        "for (long i0 = 0; i0 < n; i0 += 64)\n"
        "  for (long i = i0; i < i0 + 64 && i < n; ++i) y[i] = x[i];\n}"
    )
    tags = cpu(blocked, '["-O3", "-ffast-math"]')
    assert {"restrict_pointers", "blocked_loops", "fast_math", "opt_O3"} <= tags
    assert "no_restrict" not in tags
    assert "fast_math" not in cpu(LOOP % AXPY)


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ("for (long i = 0; i < n; ++i) y[i] = x[i] / 3.0f;", {"loop_division"}),
        ("for (long i = 0; i < n; ++i) y[i] /= x[i];", {"loop_division"}),
        ("for (long i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, "
         "_mm256_div_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(3.f)));",
         {"loop_division", "hand_vectorized"}),
        ("for (long i = 0; i < n; ++i) if (x[i] > 0) y[i] = x[i];", {"loop_branch"}),
        ("for (long i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.f;", {"loop_branch"}),
        ("for (long i = 0; i < n; ++i) y[i] = expf(x[i]);", {"loop_math"}),
        ("for (long i = 0; i < n; ++i) y[i] = std::tanh(x[i]);", {"loop_math"}),
        # outside the hot loop: a row's one reciprocal or sqrt is no target
        ("float inv = 1.0f / sqrtf(x[0]);\nfor (long i = 0; i < n; ++i) y[i] = x[i] * inv;",
         set()),
        ("for (long r = 0; r < n; ++r) { float inv = 1.0f / x[r];\n"
         "  for (long i = 0; i < n; ++i) y[i] = x[i] * inv; }", set()),
        ("for (long i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_loadu_ps(x + i));",
         {"hand_vectorized"}),
    ],
)  # fmt: skip
def test_what_a_strategy_needs_in_the_hot_loop_comes_from_code(body: str, found: set[str]) -> None:
    """A capable model was offered division, branch and fast-math strategies for its
    intrinsics kernels with none of them, over and over."""
    work = {"loop_division", "loop_branch", "loop_math", "hand_vectorized"}
    assert cpu(LOOP % body) & work == found


CUDA = """
__global__ void k(const float* __restrict__ x, float* y, int n) {
    %s
}
"""


@pytest.mark.parametrize(
    ("body", "tags"),
    [
        ("__shared__ float tile[32][33]; tile[0][0] = x[0]; __syncthreads(); y[0] = tile[0][0];",
         {"shared_memory", "syncthreads"}),
        ("float4 v = reinterpret_cast<const float4*>(x)[0]; y[0] = v.x;", {"vectorized_loads"}),
        ("float s = __shfl_down_sync(0xffffffff, x[0], 16); y[0] = s;",
         {"warp_shuffle", "warp_primitives"}),
        ("unsigned b = __ballot_sync(0xffffffff, x[0] > 0); y[0] = b;", {"warp_primitives"}),
        ("#pragma unroll\nfor (int i = 0; i < 4; ++i) atomicAdd(y, x[i]);",
         {"pragma_unroll", "atomics", "fixed_trip_loop"}),
        ("for (int t = 0; t < n; t += 32) for (int i = t; i < t + 32; ++i) y[i] = x[i];",
         {"blocked_loops", "nested_loops"}),
        ("wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;", {"tensor_cores"}),
        ("__half h = __float2half(x[0]); y[0] = __half2float(h);", {"half_precision"}),
    ],
)  # fmt: skip
def test_each_cuda_tag_comes_from_code(body: str, tags: set[str]) -> None:
    assert tags <= parsing.features(CUDA % body, "cuda")


def test_a_cuda_comment_naming_shared_memory_and_shuffles_is_no_feature() -> None:
    tags = parsing.features(CUDA % "// __shared__ __shfl_down_sync( wmma::\ny[0] = x[0];", "cuda")
    assert {"no_shared_memory", "scalar_loads"} <= tags
    assert not {"shared_memory", "warp_shuffle", "warp_primitives", "tensor_cores"} & tags
