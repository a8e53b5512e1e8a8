"""Static feature tags (docs/ARCHITECTURE.md vocabulary, `vocabulary.FEATURE_TAGS`) of
CUDA, C++ (CPU) and Triton kernels, read off the syntax tree: a word in a comment or a
string is no feature."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tree_sitter import Node

from htam_engine.parsing.cxx_source import (
    constants,
    function_facts,
    functions,
    is_blocked,
    is_fixed_trip,
    is_global,
    launch_config,
    launches,
    loops,
)
from htam_engine.parsing.python_source import call_argument, embedded_sources, flag_values
from htam_engine.parsing.trees import as_bytes, parse, text, walk
from htam_engine.parsing.triton_source import decorators, tl_calls, triton_functions, undecorated
from htam_engine.vocabulary import BACKENDS


def _cxx_sources(source: bytes, backend: str) -> tuple[list[str], list[str] | None]:
    """(C++/CUDA texts to inspect, compiler flags or None for a raw source)."""
    embedded = embedded_sources(source)
    if not embedded:
        return [source.decode(errors="replace")], None
    wanted = ("cuda", "cpp") if backend == "cuda" else ("cpp",)
    keyword = "extra_cuda_cflags" if backend == "cuda" else "extra_cflags"
    flags = flag_values(source, keyword)
    if backend == "cpu" and not any(f.startswith("-O") for f in flags):
        flags.append("-O2")  # the default of load_cpp
    return [e.text for e in embedded if e.language in wanted], flags


def _loop_tags(roots: list[Node], known: dict[str, str]) -> set[str]:
    tags: set[str] = set()
    all_loops = [loop for root in roots for loop in loops(root)]
    if all_loops:
        tags.add("loops")
    if any(len(loops(loop)) > 1 for loop in all_loops):
        tags.add("nested_loops")
    if any(is_fixed_trip(loop, known) for loop in all_loops):
        tags.add("fixed_trip_loop")
    return tags


def _work_tags(roots: list[Node], found: _Tokens) -> set[str]:
    """What some strategies need to be anything but no-ops, in an innermost loop (the hot
    one; a row's one reciprocal or sqrt outside it is no target): a division, a branch, a
    libm call; `hand_vectorized`: intrinsics and no libm call in a hot loop (a capable
    model was offered division, branch and fast-math strategies for intrinsics kernels
    with none of them, over and over)."""
    hot = [n for root in roots for loop in loops(root) if len(loops(loop)) == 1 for n in walk(loop)]
    calls = [_called(n) for n in hot if n.type == "call_expression"]
    tags = set()
    if any(text(n.child_by_field_name("operator")) in ("/", "/=") for n in hot) or any(
        re.match(VECTOR_DIVISION, name) for name in calls
    ):
        tags.add("loop_division")
    if any(n.type in ("if_statement", "conditional_expression") for n in hot):
        tags.add("loop_branch")
    math = any(re.match(MATH_CALLS, name) for name in calls)
    tags |= {"loop_math"} if math else set()
    return tags | ({"hand_vectorized"} if found.called(INTRINSIC_CALLS) and not math else set())


def _called(call: Node) -> str:
    return text(call.child_by_field_name("function")).rsplit("::", 1)[-1]


def _restrict_tag(fns: list[Node]) -> set[str]:
    facts = [function_facts(fn) for fn in fns]
    if not any(f.pointers for f in facts):
        return set()
    return {"no_restrict" if any(f.unrestricted for f in facts) else "restrict_pointers"}


def _block_sizes(root: Node, known: dict[str, str]) -> list[int]:
    sizes = []
    for call in launches(root):
        config = launch_config(call)
        if len(config) >= 2:
            value = known.get(text(config[1]), text(config[1]))
            if value.isdigit():
                sizes.append(int(value))
    return sizes


@dataclass
class _Tokens:
    """What the syntax trees of some C++/CUDA sources hold, outside comments and strings:
    pragma texts, called names, type names and qualifiers, namespaces, attributes."""

    pragmas: list[str] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    attributes: list[str] = field(default_factory=list)

    def called(self, pattern: str) -> bool:
        return any(re.match(pattern, name) for name in self.calls)

    def pragma(self, pattern: str) -> bool:
        return any(re.match(pattern, p) for p in self.pragmas)


def _tokens(roots: list[Node]) -> _Tokens:
    found = _Tokens()
    for node in (n for root in roots for n in walk(root)):
        if node.type == "preproc_call" and text(node.child_by_field_name("directive")) == "#pragma":
            found.pragmas.append(" ".join(text(node.child_by_field_name("argument")).split()))
        elif node.type == "call_expression":
            found.calls.add(_called(node))
        elif node.type in ("type_identifier", "type_qualifier", "primitive_type"):
            found.types.add(text(node))
        elif node.type == "namespace_identifier":
            found.namespaces.add(text(node))
        elif node.type == "attribute_specifier":
            found.attributes.append(text(node))
    return found


VECTOR_TYPES = {"float2", "float4", "int2", "int4", "half2", "__half2", "double2"}
HALF_TYPES = {"half", "half2", "__half", "__half2", "__nv_bfloat16", "__nv_bfloat162"}
WARP_CALLS = r"__(shfl\w*|ballot_sync|any_sync|all_sync|reduce_\w+_sync|match_\w+_sync|activemask)$"
X86_VECTORS = r"__m(64|128|256|512)[di]?(h)?$"
INTRINSIC_CALLS = r"(_mm(256|512)?_\w+|__builtin_ia32_\w+|v\w+q_[fsu]\d+)$"
MATH_CALLS = (
    r"(exp|exp2|expm1|log|log2|log10|log1p|sqrt|cbrt|pow|tanh|erf|erfc|sin|cos|tan|"
    r"sinh|cosh|atan|atan2|asin|acos|hypot|fmod)f?$"
)
VECTOR_DIVISION = r"_mm(256|512)?_div_p[sd]$"


def _cuda_tags(texts: list[str], flags: list[str] | None) -> set[str]:
    roots = [parse(t, "cuda").root_node for t in texts]
    found = _tokens(roots)
    known = {k: v for root in roots for k, v in constants(root).items()}
    kernels_ = [fn for root in roots for fn in functions(root) if is_global(fn)]
    asm = "\n".join(text(n) for root in roots for n in walk(root) if n.type == "gnu_asm_expression")
    tags = {"shared_memory" if "__shared__" in found.types else "no_shared_memory"}
    tags.add("vectorized_loads" if VECTOR_TYPES & found.types else "scalar_loads")
    warp = {name for name in found.calls if re.match(WARP_CALLS, name)}
    tags |= {"warp_primitives"} if warp or "cooperative_groups" in found.namespaces else set()
    tags |= {"warp_shuffle"} if any(name.startswith("__shfl") for name in warp) else set()
    tags |= {"pragma_unroll"} if found.pragma(r"unroll\b") else set()
    tags |= {"atomics"} if found.called(r"atomic[A-Z]\w*$") else set()
    tags |= {"syncthreads"} if "__syncthreads" in found.calls else set()
    mma = "wmma" in found.namespaces or found.called(r"mma_sync$") or "mma.sync" in asm
    tags |= {"tensor_cores"} if mma else set()
    tags |= {"half_precision"} if HALF_TYPES & found.types else set()
    striding = any("gridDim" in text(loop) for fn in kernels_ for loop in loops(fn))
    tags.add("grid_stride" if striding else "no_grid_stride")
    bounded = bool(kernels_) and all(
        any(c.type == "launch_bounds" for c in fn.children) for fn in kernels_
    )
    tags.add("launch_bounds" if bounded else "no_launch_bounds")
    tags |= _restrict_tag(kernels_) | _loop_tags(kernels_, known)
    if any(is_blocked(loop) for fn in kernels_ for loop in loops(fn)):
        tags.add("blocked_loops")
    if len(kernels_) > 1:
        tags.add("multiple_kernels")
    sizes = [s for root in roots for s in _block_sizes(root, known)]
    if any(s < 256 for s in sizes):
        tags.add("small_block")
    if any(s >= 512 for s in sizes):
        tags.add("large_block")
    fast = flags is not None and "--use_fast_math" in flags
    tags.add("fast_math" if fast else "no_fast_math")
    return tags


def _cpu_tags(texts: list[str], flags: list[str] | None) -> set[str]:
    roots = [parse(t, "cpp").root_node for t in texts]
    found = _tokens(roots)
    known = {k: v for root in roots for k, v in constants(root).items()}
    fns = [fn for root in roots for fn in functions(root)]
    threads = found.pragma(r"omp (parallel|for)\b")
    tags = {"openmp" if threads else "no_openmp"}
    simd = found.pragma(r"omp (parallel for |for )?simd\b|GCC ivdep\b")
    vectors = any(re.match(X86_VECTORS, t) for t in found.types) or any(
        "vector_size" in a for a in found.attributes
    )
    intrinsics = found.called(INTRINSIC_CALLS)
    tags |= {"simd_pragma"} if simd else set()
    tags |= {"vector_types"} if vectors else set()
    tags |= {"intrinsics"} if intrinsics else set()
    if not (simd or vectors or intrinsics):
        tags.add("no_simd")
    if found.called(r"(__builtin_prefetch|_mm_prefetch)$"):
        tags.add("prefetch")
    tags |= _restrict_tag(fns) | _loop_tags(fns, known) | _work_tags(fns, found)
    if any(is_blocked(loop) for fn in fns for loop in loops(fn)):
        tags.add("blocked_loops")
    if flags is not None:
        tags.add("opt_O3" if {"-O3", "-Ofast"} & set(flags) else "low_opt")
        if "-march=native" in flags:
            tags.add("march_native")
        if {"-ffast-math", "-Ofast"} & set(flags):
            tags.add("fast_math")
    return tags


def _keyword_values(root: Node, keyword: str) -> list[str]:
    """The text of every `keyword=value` argument under `root`."""
    return [
        text(n.child_by_field_name("value"))
        for n in walk(root)
        if n.type == "keyword_argument" and text(n.child_by_field_name("name")) == keyword
    ]


def _memory_tags(calls: list[tuple[str, Node]]) -> set[str]:
    access = [(name, call) for name, call in calls if name in ("load", "store")]
    if not access:
        return set()
    guarded = any(
        call_argument(call, "mask", 1 if name == "load" else 2) is not None
        or call_argument(call, "boundary_check") is not None
        for name, call in access
    )
    hinted = any(_keyword_values(call, k) for _, call in access for k in EVICTION_KEYWORDS)
    blocked = any(name in BLOCK_POINTERS for name, _ in calls)
    tags = {"masked" if guarded else "unmasked", "block_ptr" if blocked else "no_block_ptr"}
    return tags | ({"eviction_hints"} if hinted else set())


def _is_ieee(dot: Node) -> bool:
    precision = call_argument(dot, "input_precision")
    allow = call_argument(dot, "allow_tf32")
    return (precision is not None and text(precision).strip("\"'") == "ieee") or (
        allow is not None and text(allow) == "False"
    )


def _dot_tags(kernels_: list[Node], calls: list[tuple[str, Node]]) -> set[str]:
    dots = [call for name, call in calls if name == "dot"]
    if not dots:
        return set()
    tags = {"tl_dot", "ieee_dot" if all(map(_is_ieee, dots)) else "tf32_dot"}
    if any(any(n in dots for n in walk(loop)) for fn in kernels_ for loop in _py_loops(fn)):
        tags.add("k_loop")
    grouped = any(name == "swizzle2d" for name, _ in calls) or any(
        re.search(r"\bGROUP\w*", text(fn.child_by_field_name("parameters")))
        for fn in map(undecorated, kernels_)
    )
    return tags | {"grouped_ordering" if grouped else "no_grouping"}


def _py_loops(node: Node) -> list[Node]:
    return [n for n in walk(node) if n.type in ("for_statement", "while_statement")]


def _triton_loop_tags(kernels_: list[Node]) -> set[str]:
    all_loops = [loop for fn in kernels_ for loop in _py_loops(fn)]
    tags = {"loops"} if all_loops else set()
    if any(len(_py_loops(loop)) > 1 for loop in all_loops):
        tags.add("nested_loops")
    if any("num_programs" in text(loop.child_by_field_name("right")) for loop in all_loops):
        tags.add("persistent")
    return tags


def _launch_tags(root: Node, kernels_: list[Node]) -> set[str]:
    tuned = any("triton.autotune" in decorators(k) for k in kernels_)
    tags = {"autotune" if tuned else "no_autotune"}
    tags.add("num_warps_set" if _keyword_values(root, "num_warps") else "default_warps")
    tags.add("num_stages_set" if _keyword_values(root, "num_stages") else "default_stages")
    return tags | ({"multiple_kernels"} if len(kernels_) > 1 else set())


EVICTION_KEYWORDS = ("eviction_policy", "cache_modifier")
BLOCK_POINTERS = ("make_block_ptr", "advance", "make_tensor_descriptor")
TRITON_HALF = r"\b(tl|torch)\.(float16|bfloat16|half|float8\w*)\b|\.half\(\)"


def _triton_tags(source: bytes) -> set[str]:
    """Tags of the `@triton.jit` kernels in a Python file (or one kernel's text) and of
    the launches and autotune configs around them."""
    root = parse(source, "python").root_node
    kernels_ = triton_functions(root)
    if not kernels_:
        return set()
    calls = [c for k in kernels_ for c in tl_calls(k)]
    tags = _memory_tags(calls) | _dot_tags(kernels_, calls) | _triton_loop_tags(kernels_)
    tags |= _launch_tags(root, kernels_)
    if any(name.startswith("atomic_") for name, _ in calls):
        tags.add("atomics")
    if re.search(TRITON_HALF, source.decode(errors="replace")):
        tags.add("half_precision")
    return tags


def features(source: str | bytes, backend: str) -> set[str]:
    """Static feature tags (docs/ARCHITECTURE.md vocabulary) of a .py with embedded
    sources or a raw .cu/.cpp file (backend "cuda" or "cpu"), or of the `@triton.jit`
    kernels of a .py (backend "triton")."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "triton":
        return _triton_tags(as_bytes(source))
    texts, flags = _cxx_sources(as_bytes(source), backend)
    return _cuda_tags(texts, flags) if backend == "cuda" else _cpu_tags(texts, flags)
