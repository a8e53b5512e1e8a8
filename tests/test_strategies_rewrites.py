"""Mechanical rewrites on the real examples and on small raw sources: applicability both
ways (with a reason), idempotence, and outputs that still parse."""

from __future__ import annotations

import pytest
from helpers.examples import EXAMPLES, TASKS

from htam_engine import parsing
from htam_engine.strategies import REGISTRY, NotApplicable

EXPECTED_IDS = {
    "cuda.block_size", "cuda.restrict_const", "cuda.pragma_unroll", "cuda.launch_bounds",
    "cuda.grid_stride", "cuda.vectorize_float4", "cuda.fast_math", "cuda.warp_shuffle_reduce",
    "cuda.smem_tiling", "cpu.omp_parallel_for",
    "cpu.omp_simd", "cpu.opt_flags", "cpu.restrict", "cpu.cache_block", "cpu.vector_math",
    "cpu.branchless", "cpu.loop_order", "cpu.reciprocal", "cpu.register_tile",
    "cpu.multi_accumulator", "cpu.online_softmax", "cpu.fuse_moments", "cpu.unroll",
    "cpu.hoist_invariants", "cpu.fused_softmax", "triton.num_warps",
    "triton.num_stages", "triton.block_size", "triton.autotune", "triton.group_m",
}  # fmt: skip
# Rewrites that apply to only some examples; every other one applies to all four.
ONLY = {
    "cpu.cache_block": set(),  # the matmul example's loop order comes first
    "cpu.branchless": set(),  # no example branches per element
    "cpu.reciprocal": set(),  # the examples divide outside their inner loops
    "cpu.loop_order": {"matmul", "linear_relu"},
    "cpu.register_tile": {"matmul", "linear_relu"},
    "cpu.omp_simd": {"linear_relu", "matmul"},  # gelu's erff, softmax's expf: vector math
    "cpu.multi_accumulator": set(),  # the examples' reductions are unit-stride: simd's
    "cpu.online_softmax": set(),  # the softmax example stores its exps (its test's case)
    "cpu.fuse_moments": set(),  # no example has a mean and a variance pass
    "cpu.hoist_invariants": set(),  # no example calls math or loads in a loop on invariants
    "cpu.fused_softmax": {"softmax"},  # the only row softmax
    "cuda.pragma_unroll": {"linear_relu"},
    "cuda.vectorize_float4": {"gelu"},
    "cuda.smem_tiling": {"matmul"},  # linear_relu's accumulator starts from the bias
    "cuda.warp_shuffle_reduce": set(),  # no example has a shared tree (tests/fixtures does)
}
# C++/CUDA rewrites on all four examples; Triton's are tests/test_triton_strategies.py's.
CASES = [
    (rid, task) for rid in sorted(REGISTRY) if REGISTRY[rid].backend != "triton" for task in TASKS
]


def example(task: str, backend: str) -> str:
    return (EXAMPLES / task / f"{backend}_naive.py").read_text()


def assert_parses(source: str) -> None:
    assert not parsing.has_errors(source, "python")
    for emb in parsing.embedded_sources(source):
        assert not parsing.has_errors(emb.text, emb.language), emb.text


def test_registry_has_exactly_the_documented_ids() -> None:
    assert set(REGISTRY) == EXPECTED_IDS
    assert all(rid.split(".")[0] == rw.backend and rw.id == rid for rid, rw in REGISTRY.items())


@pytest.mark.parametrize(("rid", "task"), CASES)
def test_rewrite_on_example(rid: str, task: str) -> None:
    rewrite = REGISTRY[rid]
    source = example(task, rewrite.backend)
    reason = rewrite.check(source)
    if task not in ONLY.get(rid, set(TASKS)):
        assert isinstance(reason, str) and reason
        with pytest.raises(NotApplicable, match=rid):
            rewrite.apply(source)
        return
    assert reason is None
    out = rewrite.apply(source)
    assert out != source
    assert_parses(out)
    assert rewrite.apply(source) == out  # deterministic
    again = rewrite.check(out)
    assert isinstance(again, str) and again  # never applied twice


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_all_rewrites_chain(task: str, backend: str) -> None:
    source = example(task, backend)
    applied = 0
    for rewrite in REGISTRY.values():
        if rewrite.backend == backend and rewrite.check(source) is None:
            source = rewrite.apply(source)
            applied += 1
            assert_parses(source)
    assert applied >= 4


SCALE = """\
#define THREADS 128
__global__ void scale(float* data, const float* factor, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = data[i] * factor[i];
        data[i] += 1.0f;
    }
}
"""
TILES = """\
__global__ void tiles(const float* x, float* y, int n) {
    __shared__ float tile[THREADS];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        tile[threadIdx.x] = x[i];
        __syncthreads();
        for (int k = 0; k < 8; ++k) {
            y[i] += tile[(threadIdx.x + k) % THREADS];
        }
    }
}
"""
LAUNCH_SCALE = """\
void launch_scale(float* d, const float* f, float* o, int n) {
    scale<<<(n + THREADS - 1) / THREADS, THREADS>>>(d, f, o, n);
}
"""
LAUNCH_TILES = """\
void launch_tiles(const float* f, float* o, int n) {
    tiles<<<(n + THREADS - 1) / THREADS, THREADS>>>(f, o, n);
}
"""
RAW_CUDA = SCALE + TILES + LAUNCH_SCALE + LAUNCH_TILES


def test_block_size_follows_a_named_constant_and_launch_bounds() -> None:
    bounded = REGISTRY["cuda.launch_bounds"].apply(RAW_CUDA)
    assert bounded.count("__launch_bounds__(128)") == 2
    out = REGISTRY["cuda.block_size"].apply(bounded)
    assert "#define THREADS 256" in out and "__launch_bounds__(256)" in out
    assert "__launch_bounds__(128)" not in out
    assert "already" in (REGISTRY["cuda.block_size"].check(out) or "")


def test_restrict_const_only_where_read_only() -> None:
    out = REGISTRY["cuda.restrict_const"].apply(RAW_CUDA)
    assert "float* __restrict__ data" in out and "const float* __restrict__ data" not in out
    assert "const float* __restrict__ factor" in out
    assert "float* __restrict__ out" in out and "const float* __restrict__ out" not in out


def test_grid_stride_skips_kernels_that_synchronise() -> None:
    out = REGISTRY["cuda.grid_stride"].apply(RAW_CUDA)
    assert out.count("blockDim.x * gridDim.x") == 1
    assert "__syncthreads();\n" in out and "if (i < n)" in out


def test_vectorize_loads_values_that_are_read_and_written() -> None:
    assert "launch is not in this source" in (REGISTRY["cuda.vectorize_float4"].check(SCALE) or "")
    out = REGISTRY["cuda.vectorize_float4"].apply(SCALE + LAUNCH_SCALE)
    assert "float4 data_v4 = reinterpret_cast<const float4*>(data)" in out
    assert "float4 out_v4;" in out
    assert "reinterpret_cast<float4*>(data)[i_v4] = data_v4;" in out
    assert not parsing.has_errors(out, "cuda")


def test_pragma_unroll_on_fixed_trip_loop_of_raw_cuda() -> None:
    out = REGISTRY["cuda.pragma_unroll"].apply(RAW_CUDA)
    assert "        #pragma unroll\n        for (int k = 0; k < 8; ++k)" in out


@pytest.mark.parametrize("rid", ["cuda.fast_math", "cpu.opt_flags"])
def test_flag_rewrites_say_why_not_on_raw_sources(rid: str) -> None:
    reason = REGISTRY[rid].check(RAW_CUDA)
    assert reason is not None and "raw source" in reason


PREFIX = """\
extern "C" void prefix(float* x, long n) {
    for (long i = 1; i < n; ++i) {
        x[i] += x[i - 1];
    }
}
"""
TOTAL = """\
extern "C" void total(const float* x, float* out, long n) {
    float s = 0.0f;
    for (long i = 0; i < n; ++i) {
        s += x[i];
    }
    out[0] = s;
}
"""
RAW_CPP = PREFIX + TOTAL


def test_omp_rewrites_respect_dependences() -> None:
    assert "another index" in (REGISTRY["cpu.omp_parallel_for"].check(RAW_CPP) or "")
    assert "outer variable 's'" in (REGISTRY["cpu.omp_parallel_for"].check(TOTAL) or "")
    out = REGISTRY["cpu.omp_simd"].apply(RAW_CPP)
    assert out.count("#pragma omp simd") == 1
    assert "#pragma omp simd reduction(+:s)\n    for (long i = 0;" in out


def test_parallel_and_simd_merge_into_one_pragma() -> None:
    source = example("matmul", "cpu")
    both = REGISTRY["cpu.omp_simd"].apply(REGISTRY["cpu.omp_parallel_for"].apply(source))
    assert "#pragma omp parallel for simd\n" in both
    assert "-fopenmp-simd" not in both and '"-fopenmp"' in both


def test_bad_input_gives_reasons_not_tracebacks() -> None:
    for rewrite in REGISTRY.values():
        for source in ("", "def f(:\n", "int main( {"):
            reason = rewrite.check(source)
            assert isinstance(reason, str) and reason
