"""tree-sitter views: embedded sources map back to exact file bytes, kernel units,
feature tags in the shared vocabulary, operator families."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.examples import EXAMPLES, TASKS

from htam_engine import parsing
from htam_engine.parsing import cxx_source
from htam_engine.vocabulary import FAMILIES, FEATURE_TAGS

# C++/CUDA starts; the Triton ones (no embedded sources) are tests/test_triton_parsing.py's.
EXAMPLE_FILES = sorted(p for p in EXAMPLES.glob("*/*_naive.py") if not p.name.startswith("triton"))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_embedded_offsets_map_back_exactly(path: Path) -> None:
    data = path.read_bytes()
    embedded = parsing.embedded_sources(data)
    assert embedded
    for emb in embedded:
        assert data[emb.start_byte : emb.end_byte].decode() == emb.text
        row, column = emb.start_point
        line_start = sum(len(line) for line in data.splitlines(keepends=True)[:row])
        assert line_start + column == emb.start_byte
        assert data[emb.call_start_byte :].startswith(emb.call.encode())


def test_embedded_forms_direct_list_variable_and_positional() -> None:
    source = (
        "import torch.utils.cpp_extension as ext\n"
        "from htam_engine import kernels\n"
        'HEAD = "// é unicode before\\n"\n'
        'K = r"""__global__ void k() {}"""\n'
        'm = ext.load_inline("m", "int f();", cuda_sources=[K, "void g() {}"])\n'
        'lib = kernels.load_cpp("c", "extern \\"C\\" void h() {}")\n'
        'other = print("not a kernel")\n'
        'empty = kernels.load_cpp("e", "")\n'
    )
    data = source.encode()
    found = parsing.embedded_sources(source)
    assert [(e.name, e.language, e.call) for e in found] == [
        ("K", "cuda", "load_inline"),
        ("load_inline.cpp_sources", "cpp", "load_inline"),
        ("load_inline.cuda_sources", "cuda", "load_inline"),
        ("load_cpp.source", "cpp", "load_cpp"),
        ("load_cpp.source", "cpp", "load_cpp"),
    ]
    for emb in found:
        assert data[emb.start_byte : emb.end_byte].decode() == emb.text
    assert found[-1].text == "" and found[0].text == "__global__ void k() {}"


def test_embedded_sources_of_broken_or_plain_python_is_empty() -> None:
    assert parsing.embedded_sources("def f(:\n  load_inline(") == []
    assert parsing.embedded_sources("__global__ void k(float* x) {}") == []


def test_kernels_of_a_cuda_example_python_file() -> None:
    path = EXAMPLES / "gelu" / "cuda_naive.py"
    data = path.read_bytes()
    units = {u.name: u for u in parsing.kernels(data, "python")}
    assert units["gelu_kernel"].kind == "global"
    assert units["gelu_kernel"].launchers == ("gelu_launch",)
    assert units["ModelNew"].kind == "model" and units["load_inline"].kind == "module"
    kernel = units["gelu_kernel"]
    assert data[kernel.start_byte : kernel.end_byte].startswith(b"__global__ void gelu_kernel")
    assert data[kernel.name_start : kernel.name_end] == b"gelu_kernel"


NESTED_CUDA = b"""
namespace ops {
#ifdef USE_FAST
template <int BLOCK>
__global__ void fast_scale(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2; }
#else
__global__ void slow_scale(float* x, int n) { x[threadIdx.x] *= 2; }
#endif
struct Launcher {
  void run(float* x, int n) { slow_scale<<<1, 32>>>(x, n); }
};
}  // namespace ops
extern "C" { void entry(float* x) {} }
"""


def test_kernels_wherever_they_are_declared() -> None:
    units = {u.name: u for u in parsing.kernels(NESTED_CUDA, "cuda")}
    assert set(units) == {"fast_scale", "slow_scale", "run", "entry"}
    assert units["fast_scale"].kind == units["slow_scale"].kind == "global"
    assert units["slow_scale"].launchers == ("run",)
    assert units["slow_scale"].facts is not None and not units["slow_scale"].facts.bounds_checked
    assert units["fast_scale"].facts is not None and units["fast_scale"].facts.bounds_checked
    for unit in units.values():
        assert NESTED_CUDA[unit.name_start : unit.name_end] == unit.name.encode()


def test_the_engine_and_the_editor_see_the_same_kernels() -> None:
    tree = parsing.parse(NESTED_CUDA, "cuda")
    functions = {cxx_source.function_name(fn) for fn in cxx_source.functions(tree.root_node)}
    assert functions == {u.name for u in parsing.kernels(NESTED_CUDA, "cuda", tree=tree)}


def test_kernels_of_raw_sources() -> None:
    raw = '__global__ void k(float* x) {}\nextern "C" void host(float* x) { k<<<1, 32>>>(x); }\n'
    units = parsing.kernels(raw, "cuda")
    assert [(u.name, u.kind, u.launchers) for u in units] == [
        ("k", "global", ("host",)),
        ("host", "host", ()),
    ]
    cpp = (EXAMPLES / "softmax" / "cpu_naive.py").read_text()
    (unit,) = [u for u in parsing.kernels(cpp, "python") if u.kind == "host"]
    assert unit.name == "softmax_forward" and unit.language == "cpp"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_feature_tags_use_the_documented_vocabulary(path: Path) -> None:
    backend = "cuda" if path.name.startswith("cuda") else "cpu"
    tags = parsing.features(path.read_text(), backend)
    assert tags <= FEATURE_TAGS[backend]
    if backend == "cuda":
        assert {"scalar_loads", "no_shared_memory", "no_grid_stride", "small_block"} <= tags
        assert {"no_launch_bounds", "no_restrict", "no_fast_math"} <= tags
    else:
        assert {"no_openmp", "no_simd", "low_opt", "no_restrict", "loops"} <= tags


def test_feature_tags_see_optimised_code() -> None:
    cuda = """
    #define TILE 16
    __global__ void __launch_bounds__(512)
    a(const float* __restrict__ x, float* __restrict__ y, int n) {
        __shared__ float s[TILE];
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
            float4 v = reinterpret_cast<const float4*>(x)[i];
            #pragma unroll
            for (int k = 0; k < TILE; ++k) { s[k] = __shfl_down_sync(0xffffffff, v.x, k); }
            __syncthreads();
            atomicAdd(y, s[0]);
        }
    }
    __global__ void __launch_bounds__(512) b(half* __restrict__ h) {}
    void go(float* x, float* y, int n) { a<<<n / 512, 512>>>(x, y, n); }
    """
    tags = parsing.features(cuda, "cuda")
    assert tags == {
        "shared_memory", "vectorized_loads", "warp_primitives", "grid_stride",
        "restrict_pointers", "launch_bounds",
        "pragma_unroll", "fixed_trip_loop", "loops", "nested_loops", "atomics", "warp_shuffle",
        "syncthreads", "half_precision", "multiple_kernels", "large_block", "no_fast_math",
    }  # fmt: skip
    assert "no_restrict" in parsing.features(
        cuda.replace("half* __restrict__ h", "float* h"), "cuda"
    )


def test_cpu_tags_follow_the_rewrites() -> None:
    from htam_engine.strategies import REGISTRY

    source = (EXAMPLES / "matmul" / "cpu_naive.py").read_text()
    for rid in ("cpu.opt_flags", "cpu.loop_order", "cpu.omp_parallel_for", "cpu.omp_simd"):
        source = REGISTRY[rid].apply(source)  # (cache_block needs a nest in layout order)
    tags = parsing.features(source, "cpu")
    assert {"opt_O3", "march_native", "openmp", "simd_pragma"} <= tags
    assert not {"low_opt", "no_openmp", "no_simd"} & tags


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("gelu", "elementwise"),
        ("softmax", "reduction"),
        ("matmul", "matmul"),
        ("linear_relu", "fused"),
    ],
)
def test_family_of_the_example_references(task: str, expected: str) -> None:
    assert task in TASKS
    assert parsing.family((EXAMPLES / task / "reference.py").read_text()) == expected


@pytest.mark.parametrize(
    ("forward", "expected"),
    [
        ("return torch.relu(x) * 2.0", "elementwise"),
        ("return torch.nn.functional.gelu(self.norm(x))", "reduction"),
        ("return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", "reduction"),
        ("return torch.relu(x @ x.T).sum(dim=1)", "fused"),
        ("return x.sum(dim=1)", "reduction"),
        ("return x @ x.T", "matmul"),
        ("return torch.flip(x, [0])", "unknown"),
    ],
)
def test_family_heuristics(forward: str, expected: str) -> None:
    source = (
        "import torch\nclass Model(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.norm = torch.nn.LayerNorm(8)\n"
        f"    def forward(self, x):\n        {forward}\n"
    )
    assert parsing.family(source) == expected
    assert expected in FAMILIES


def test_family_without_a_model_is_unknown() -> None:
    assert parsing.family("x = 1\n") == "unknown"
    assert parsing.family(b"\xff\xfe not python") == "unknown"


def test_bad_language_and_backend_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown language 'rust'"):
        parsing.parse("fn main() {}", "rust")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        parsing.features("", "tpu")


def test_invalid_utf8_never_raises() -> None:
    """A user's broken file is parsed as far as it goes, never an exception."""
    broken = (
        (EXAMPLES / "softmax" / "cpu_naive.py")
        .read_bytes()
        .replace(b"float m = xr[0];", b"float m = xr[0]; // \xff\xfe")
    )
    sources = parsing.embedded_sources(broken)
    assert sources and "\ufffd" in sources[0].text
    assert any(k.name == "softmax_forward" for k in parsing.kernels(broken, "python"))
    assert "loops" in parsing.features(broken, "cpu")
