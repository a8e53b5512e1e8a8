"""cuda.warp_shuffle_reduce and cuda.smem_tiling on real kernels: the rewrites apply to a
shared-memory tree reduction and to naive matmuls (the example's flat index and a 2D
grid with ragged sizes), compile with nvcc, compute the reference's result under the
lockstep CPU emulation (helpers/emulation.py) and on a GPU when there is one, and refuse
the kernels they must not touch with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cuda import NVCC, kernel_sources, nvcc_compile
from helpers.emulation import emulated, launcher
from helpers.examples import EXAMPLES, assert_close, load_module
from helpers.skips import require

from htam_engine.kernels import load_cpp
from htam_engine.strategies import REGISTRY, Rewrite

FIXTURES = Path(__file__).parent / "fixtures" / "cuda_blocks"
REDUCE = FIXTURES / "row_reduce" / "cuda_tree.py"
MATMUL_2D = FIXTURES / "matmul_2d" / "cuda_naive.py"
MATMUL_FLAT = EXAMPLES / "matmul" / "cuda_naive.py"
WARP, TILING = REGISTRY["cuda.warp_shuffle_reduce"], REGISTRY["cuda.smem_tiling"]
CASES = [(WARP, REDUCE), (TILING, MATMUL_2D), (TILING, MATMUL_FLAT)]
IDS = ["warp-row_reduce", "tiling-matmul_2d", "tiling-matmul_example"]

TREE = """
__global__ void reduce(const float* x, float* out) {{
    __shared__ float sdata[256];
    unsigned int tid = threadIdx.x;
    sdata[tid] = x[blockIdx.x * blockDim.x + tid];
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (tid < s) sdata[tid] {step};
        __syncthreads();
    }}
    if (tid == 0) out[blockIdx.x] = sdata[{result}];
}}
void launch(const float* x, float* out, int n) {{ reduce<<<n / {block}, {block}>>>(x, out); }}
"""
MATMUL = """
__global__ void mm(const float* a, const float* b, float* c, int M, int N, int K) {{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {{
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += {product};
        c[row * N + col] = acc;
    }}
}}
void launch(const float* a, const float* b, float* c, int M, int N, int K) {{
    mm<<<dim3((N + 15) / 16, (M + 15) / 16), dim3(16, 16)>>>(a, b, c, M, N, K);
}}
"""


PRODUCT = "a[row * K + k] * b[k * N + col]"


def tree(step: str = "+= sdata[tid + s]", block: str = "256", result: str = "0") -> str:
    return TREE.format(step=step, block=block, result=result)


def run_fixture(path: Path, source: str) -> None:
    """Run the kernel source of candidate `source` (a fixture) under emulation against the
    fixture's reference, on its own inputs."""
    reference = load_module(path.parent / "reference.py")
    (kernel,) = kernel_sources(source)
    launch = launcher(load_cpp(path.stem, emulated(kernel), ["-O2"]), kernel)
    torch.manual_seed(1)
    inputs = [x.contiguous() for x in reference.get_inputs()]
    expected = reference.Model()(*inputs)
    out = torch.full_like(expected, float("nan"))
    if len(inputs) == 1:
        launch(inputs[0].data_ptr(), out.data_ptr(), *inputs[0].shape)
    else:
        a, b = inputs
        launch(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.shape[0], b.shape[1], a.shape[1])
    assert_close(expected, out)


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTAM_BUILD_DIR", str(tmp_path_factory.getbasetemp() / "builds"))


def test_the_tree_ends_in_warp_shuffles_without_barriers() -> None:
    (kernel,) = kernel_sources(WARP.apply(REDUCE.read_text()))
    assert kernel.count("__shfl_down_sync(0xffffffff, v, offset)") == 2
    assert kernel.count("s > 32;") == 2 and "s > 0;" not in kernel
    assert "v = fmaxf(v, smax[threadIdx.x + 32]);" in kernel and "v += sdata[tid + 32];" in kernel
    warp = kernel.split("if (tid < 32) {")[1].split("}")[0]
    assert "__syncthreads" not in warp and "if (tid == 0) sdata[0] = v;" in warp


def test_tiling_stages_both_operands_and_retargets_the_launch() -> None:
    (kernel,) = kernel_sources(TILING.apply(MATMUL_2D.read_text()))
    assert "#define TILE 16" in kernel and "__launch_bounds__(TILE * TILE)" in kernel
    assert "__shared__ float tile_a[TILE][TILE];" in kernel
    assert "B[kb * N + col] : 0.0f;" in kernel and kernel.count("__syncthreads();") == 2
    assert "<<<dim3((N + TILE - 1) / TILE, (M + TILE - 1) / TILE), dim3(TILE, TILE)>>>" in kernel
    assert "dim3 block" not in kernel and "dim3 grid" not in kernel  # the launch's own, now unused


@pytest.mark.parametrize(("rewrite", "path"), CASES[:2], ids=IDS[:2])
def test_the_original_and_the_rewrite_match_the_reference_under_emulation(
    rewrite: Rewrite, path: Path
) -> None:
    """(The example matmul is emulated with every rewrite in test_strategies_cuda_emulated.)"""
    source = path.read_text()
    run_fixture(path, source)
    run_fixture(path, rewrite.apply(source))


def test_emulation_catches_a_tiling_without_its_barrier() -> None:
    broken = TILING.apply(MATMUL_2D.read_text()).replace("__syncthreads();", "", 1)
    with pytest.raises(AssertionError):
        run_fixture(MATMUL_2D, broken)


@pytest.mark.parametrize(("rewrite", "path"), CASES, ids=IDS)
def test_rewritten_kernels_compile_with_nvcc(rewrite: Rewrite, path: Path, tmp_path: Path) -> None:
    require(None if NVCC else "nvcc is not on PATH")
    (kernel,) = kernel_sources(rewrite.apply(path.read_text()))
    result = nvcc_compile(kernel, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (tree("-= sdata[tid + s]"), "'-=', not a commutative +, max or min"),
        (tree("= sdata[tid] * sdata[tid + s]"), "combines with '*', not +, max or min"),
        (tree("+= sdata[tid + 2 * s]"), "does not combine sdata[tid] with sdata[tid + s]"),
        (tree("= fmaxf(sdata[tid], x[s])"), "does not combine sdata[tid] with sdata[tid + s]"),
        (tree(block="48"), "block of 48 threads is not a power of two"),
        (tree(result="1"), "'sdata' is read at other indices than 0"),
        (tree().replace("threadIdx.x;", "threadIdx.y;"), "'tid' is not threadIdx.x"),
        (tree().replace("blockDim.x / 2", "128"), "does not start at blockDim.x / 2"),
        (tree().replace("__shared__ ", ""), "'sdata' is not a __shared__ array"),
        (tree().replace("reduce<<<n / 256, 256>>>(x, out);", ""), "block size is not known"),
        (tree().replace(" + tid];\n    __syncthreads();", "];"), "already reduces"),
        (MATMUL_FLAT.read_text(), "no shared-memory tree reduction"),
    ],
)
def test_warp_shuffle_reduce_refuses_with_a_reason(source: str, reason: str) -> None:
    if reason == "already reduces":
        source = WARP.apply(tree())
    why = WARP.check(source)
    assert why is not None and reason in why, why


def test_launch_bounds_stand_in_for_a_launch_in_another_source() -> None:
    bounded = tree().replace("__global__ void", "__global__ void __launch_bounds__(256)")
    assert WARP.check(bounded.split("void launch")[0]) is None


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (MATMUL.format(product="a[row * K + k] * b[col * K + k]"), "b is read as b[col*K+k]"),
        (MATMUL.format(product="a[row * K + 2 * k] * b[k * N + col]"), "not with unit stride"),
        (MATMUL.format(product="a[row * K + k] + b[k * N + col]"), "not one `acc += A[...] * B"),
        (MATMUL.format(product=PRODUCT).split("void launch")[0], "its launch is not in this"),
        (MATMUL.format(product=PRODUCT).replace("= 0.0f", "= c[0]"), "does not start from a"),
        (MATMUL.format(product=PRODUCT).replace("c[row * N", "c[col * M"), "not stored at C[row"),
        (TILING.apply(MATMUL_2D.read_text()), "already uses shared memory"),
        ((EXAMPLES / "linear_relu" / "cuda_naive.py").read_text(), "'acc' does not start from"),
        (REDUCE.read_text(), "row_sum_kernel"),
    ],
)
def test_smem_tiling_refuses_with_a_reason(source: str, reason: str) -> None:
    why = TILING.check(source)
    assert why is not None and reason in why, why


@pytest.mark.gpu
@pytest.mark.parametrize(("rewrite", "path"), CASES, ids=IDS)
def test_rewritten_kernels_match_pytorch_on_the_gpu(
    rewrite: Rewrite, path: Path, tmp_path: Path
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    candidate = tmp_path / path.name
    candidate.write_text(rewrite.apply(path.read_text()))
    reference = load_module(path.parent / "reference.py")
    impl = load_module(candidate)
    torch.manual_seed(1)
    inputs = [x.cuda() for x in reference.get_inputs()]
    with torch.no_grad():
        expected = reference.Model().cuda()(*inputs)
        actual = impl.ModelNew().cuda()(*inputs)
    assert_close(expected, actual)
