"""Applicability as data: every local strategy declares the families and tags it needs
and forbids, the policy offers only those that fit, and a thread strategy never fits
while timing runs one thread."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from htam_engine import parsing
from htam_engine.memory import START, Evidence, load_seed
from htam_engine.memory.model import LocalNode
from htam_engine.policy import EvidenceLocalSelector, PolicyConfig, select_global
from htam_engine.state import State
from htam_engine.strategies import REGISTRY
from htam_engine.vocabulary import BACKENDS, FAMILIES, state_tags

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_state(name: str, threads: int = 1) -> State:
    source = (EXAMPLES / name / "cpu_naive.py").read_text()
    family = parsing.family((EXAMPLES / name / "reference.py").read_text())
    tags = parsing.features(source, "cpu")
    return State("cpu", family, f"cpu:{family}:{name}", tags, {"first_step"}, threads=threads)


def test_fits_says_why_not() -> None:
    node = LocalNode("n", "g", "N", "edit", families=["matmul"], needs=["loops"],
                     forbids=["intrinsics"])  # fmt: skip
    assert node.fits("matmul", {"loops"}) is None
    assert node.fits("reduction", {"loops"}) == "for matmul kernels, not reduction"
    assert node.fits("matmul", set()) == "needs loops"
    assert node.fits("matmul", {"loops", "intrinsics"}) == "not with intrinsics"
    assert LocalNode("any", "g", "A", "edit").fits("unknown", set()) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_declarations_use_known_families_and_tags(backend: str) -> None:
    graph = load_seed(backend)
    known = state_tags(backend)  # type: ignore[arg-type]
    for node in graph.locals.values():
        assert set(node.families) <= set(FAMILIES) - {"unknown"}, node.id
        assert set(node.needs) | set(node.forbids) <= known, node.id
        assert set(node.texts) <= set(FAMILIES), node.id
    assert any(node.families for node in graph.locals.values())


def test_thread_strategies_fit_only_where_timing_has_threads() -> None:
    graph = load_seed("cpu")
    threaded = graph.locals_of("thread_parallelism")
    assert threaded
    for name in ("softmax", "matmul", "gelu", "linear_relu"):
        one, many = example_state(name), example_state(name, threads=4)
        assert all(n.fits(one.family, one.tags()) for n in threaded)
        decision = select_global(graph, [START] * 3, one, PolicyConfig(), random.Random(0))
        assert "thread_parallelism" not in {c.id for c in decision.candidates}
        assert any(n.fits(many.family, many.tags()) is None for n in threaded)


def test_offered_texts_never_suggest_threads() -> None:
    graph = load_seed("cpu")
    for node in graph.locals.values():
        if node.parent == "thread_parallelism":
            continue
        words = " ".join([node.edit_pattern, *node.texts.values(), *node.checks])
        assert not re.search(r"-fopenmp(?!-simd)|parallel for|use .* threads", words), node.id
    assert "OpenMP" not in graph.globals["compiler_flags"].intent


@pytest.mark.parametrize("name", ["softmax", "matmul", "gelu", "linear_relu"])
@pytest.mark.parametrize("seed", range(8))
def test_the_policy_offers_only_strategies_that_fit(name: str, seed: int) -> None:
    graph, state = load_seed("cpu"), example_state(name)
    decision = select_global(graph, [START] * 3, state, PolicyConfig(), random.Random(seed))
    tags = state.tags()
    fitting = {n.parent for n in graph.locals.values() if n.fits(state.family, tags) is None}
    assert {c.id for c in decision.candidates} == fitting
    local = EvidenceLocalSelector().choose(graph, decision.chosen, state, {})
    assert graph.locals[local.local_id].fits(state.family, state.tags()) is None
    blocked = [why for _, score, why in local.ranking if score == float("-inf")]
    assert all(why.startswith("not applicable: ") for why in blocked)


def test_a_row_reduction_and_a_gemm_start_from_different_priors() -> None:
    graph = load_seed("cpu")
    tiling = graph.edges[(START, "cache_locality")]
    fusion = graph.edges[(START, "algorithm_fusion")]
    simd = graph.edges[(START, "vectorization")]
    assert tiling.prior_for("matmul") > tiling.prior_for("reduction") == 0.0
    assert fusion.prior_for("reduction") > fusion.prior_for("matmul")
    assert simd.prior_for("reduction") > simd.prior_for("matmul")
    softmax = example_state("softmax")
    fitting = {
        lid
        for lid, node in graph.locals.items()
        if node.parent == "cache_locality" and node.fits(softmax.family, softmax.tags()) is None
    }
    # only the reorder of a strided reduction nest (a sum over a middle dimension) declares
    # reductions, and its rewrite refuses a row softmax: no matmul text reaches a row
    assert fitting <= {"loop_order"}
    source = (EXAMPLES / "softmax" / "cpu_naive.py").read_text()
    assert REGISTRY["cpu.loop_order"].check(source) is not None


def test_the_gemm_text_knows_the_linear_weight_layout() -> None:
    graph = load_seed("cpu")
    for lid in ("soa_layout", "loop_interchange", "cache_block"):
        node = graph.locals[lid]
        gemm = node.edit_for("fused") if "fused" in node.texts else node.edit_for("matmul")
        assert "(N, K)" in gemm, lid
        assert "(N, K)" in node.prompt_text("matmul" if "matmul" in node.texts else "fused")
    assert graph.locals["fuse_passes"].edit_for("reduction") != graph.locals[
        "fuse_passes"
    ].edit_for("elementwise")


def test_evidence_carries_its_family_and_examples_prefer_the_same_family() -> None:
    node = load_seed("cpu").locals["omp_simd"]
    node.record(Evidence("cpu:matmul:mm", "improved", 3.0, 1.0, "MATMUL CODE"))
    node.record(Evidence("cpu:reduction:softmax", "improved", 1.5, 1.0, "SOFTMAX CODE"))
    assert [e.family for e in node.evidence_positive] == ["matmul", "reduction"]
    best = node.example("reduction")
    assert best is not None and best.code_excerpt == "SOFTMAX CODE"
    other = node.example("elementwise")
    assert other is not None and other.code_excerpt == "MATMUL CODE"  # the best of any


def test_streaming_stores_fit_a_memory_bound_kernel_not_a_compute_bound_gemm() -> None:
    """What a capable model wrote as its own strategy for an L2 norm (1.14x over its
    hand-vectorized code) is a named strategy the memory can credit, where it can help:
    not for a loss, whose output is one float (a hinge loss was offered it twice)."""
    node = load_seed("cpu").locals["streaming_stores"]
    norm, gemm = example_state("softmax"), example_state("matmul")
    assert node.fits(norm.family, norm.tags() | {"memory_bound", "large_output"}) is None
    assert node.fits(norm.family, norm.tags() | {"large_output"}) == "needs memory_bound"
    assert node.fits(norm.family, norm.tags() | {"memory_bound"}) == "needs large_output"
    assert node.fits(gemm.family, gemm.tags() | {"compute_bound"}) is not None
    assert node.mechanical is None  # a model's to write


def test_a_blocked_gemm_is_offered_tuning_not_blocking_again() -> None:
    """Once a model's GEMM was blocked and register-tiled, its answerer had nothing to
    choose but "other_direction" or "stop": tuning the blocks is a strategy of its own."""
    graph = load_seed("cpu")
    gemm = example_state("matmul")
    tiled = gemm.tags() | {"blocked_loops", "intrinsics"}
    assert graph.locals["gemm_block_tuning"].fits(gemm.family, tiled) is None
    assert graph.locals["gemm_block_tuning"].fits(gemm.family, gemm.tags()) is not None
    assert graph.locals["register_tiling_cpu"].fits(gemm.family, tiled) is not None
