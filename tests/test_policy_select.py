"""The selection policy: global scoring, ablations, local ranking, reward, learning."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from htam_engine.memory import EVIDENCE_BOUND, START, Graph, Outcome, load_seed
from htam_engine.memory.model import LocalNode
from htam_engine.policy import (
    MODES,
    EvidenceLocalSelector,
    NoApplicableStrategy,
    PolicyConfig,
    make_prefix,
    reward,
    select_global,
)
from htam_engine.state import PathEntry, State
from htam_engine.vocabulary import STATUS_TABLE, Status

GRAPHS = {backend: load_seed(backend) for backend in ("cuda", "cpu")}

STATUSES = tuple(STATUS_TABLE)


def state(backend: str = "cuda", path: list[PathEntry] | None = None, **kw: object) -> State:
    return State(
        backend=backend,
        family=str(kw.get("family", "elementwise")),
        task_signature=f"{backend}:relu:f32[1M]",
        features=set(kw.get("features", {"scalar_loads", "no_restrict"})),  # type: ignore[call-overload]
        feedback={"first_step"} if not path else set(),
        path=path or [],
    )


def probability_of(graph: Graph, gid: str, prefix: list[str], s: State, tau: float = 0.3) -> float:
    decision = select_global(graph, prefix, s, PolicyConfig(tau=tau), random.Random(0))
    return next(c.probability for c in decision.candidates if c.id == gid)


def step(graph: Graph, s: State, config: PolicyConfig, rng: random.Random, speedup: float) -> str:
    """One select -> local -> update step with a fixed outcome; returns the chosen direction."""
    prefix = make_prefix(s.path, config.K)
    decision = select_global(graph, prefix, s, config, rng)
    local = (
        decision.chosen_local
        or EvidenceLocalSelector().choose(graph, decision.chosen, s, {}).local_id
    )
    status = "improved" if speedup > 1 else "not_improved"
    graph.apply_outcome(
        Outcome(
            s.backend,
            s.task_signature,
            prefix,
            decision.alphas,
            decision.chosen,
            local,
            status,
            True,
            True,
            speedup,
            1.0,
            reward(status, speedup),
            "code",
        )
    )
    s.path.append(PathEntry(decision.chosen, local, status))
    return decision.chosen


@settings(max_examples=60, deadline=None)
@given(
    backend=st.sampled_from(["cuda", "cpu"]),
    mode=st.sampled_from(MODES),
    tau=st.floats(0.01, 10.0),
    history=st.lists(st.integers(0, 20), max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_probabilities_sum_to_one_and_every_number_is_kept(
    backend: str, mode: str, tau: float, history: list[int], seed: int
) -> None:
    graph = GRAPHS[backend]
    gids = sorted(graph.globals)
    path = [PathEntry(gids[h % len(gids)], "x", STATUSES[h % len(STATUSES)]) for h in history]
    s = state(backend, path)
    prefix = make_prefix(path, 3)
    config = PolicyConfig(tau=tau, mode=mode)  # type: ignore[arg-type]
    decision = select_global(graph, prefix, s, config, random.Random(seed))
    assert math.fsum(c.probability for c in decision.candidates) == pytest.approx(1.0)
    assert math.fsum(decision.alphas) == pytest.approx(1.0)
    assert decision.chosen in graph.globals
    data = decision.to_json()
    assert data["temperature"] == tau and len(data["alphas"]) == len(prefix)
    for candidate in data["candidates"]:
        assert {"score", "probability", "node_utility", "trigger_matches"} <= candidate.keys()
        if mode in ("htam", "no_local", "random"):
            assert len(candidate["edge_terms"]) == len(prefix)
            assert all(
                {"n", "mean", "prior", "utility"} <= t.keys() for t in candidate["edge_terms"]
            )


@settings(max_examples=40, deadline=None)
@given(tau_low=st.floats(0.02, 1.0), factor=st.floats(1.5, 20.0))
def test_lower_temperature_concentrates_mass_on_the_best_direction(
    tau_low: float, factor: float
) -> None:
    graph, s = GRAPHS["cuda"], state()
    low = select_global(graph, [START], s, PolicyConfig(tau=tau_low), random.Random(0))
    high = select_global(graph, [START], s, PolicyConfig(tau=tau_low * factor), random.Random(0))
    assert max(c.probability for c in low.candidates) >= max(c.probability for c in high.candidates)


def test_a_consistently_rewarded_transition_gains_probability() -> None:
    graph = load_seed("cuda")
    path = [PathEntry("launch_host", "merge_kernel_launches", "improved")]
    s = state(path=path, family="reduction")  # warp primitives fit a reduction
    prefix = make_prefix(s.path, 3)
    before = probability_of(graph, "warp_primitives", prefix, s)
    for _ in range(10):
        graph.apply_outcome(
            Outcome(
                "cuda",
                "t",
                prefix,
                [0.1, 0.2, 0.7],
                "warp_primitives",
                "warp_per_row",
                "improved",
                True,
                True,
                1.8,
                1.0,
                reward("improved", 1.8),
            )
        )
    after = probability_of(graph, "warp_primitives", prefix, s)
    assert after > before
    edge = graph.edges[("launch_host", "warp_primitives")]
    assert edge.stats.weight == pytest.approx(7.0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(MODES))
def test_identical_seeds_give_identical_runs(seed: int, mode: str) -> None:
    runs = []
    for _ in range(2):
        graph, s, rng = load_seed("cpu"), state("cpu"), random.Random(seed)
        config = PolicyConfig(mode=mode)  # type: ignore[arg-type]
        runs.append([step(graph, s, config, rng, 1.0 + (i % 3) * 0.2) for i in range(8)])
    assert runs[0] == runs[1]


@settings(max_examples=20, deadline=None)
@given(
    outcomes=st.lists(
        st.tuples(st.sampled_from(STATUSES), st.floats(0.1, 5.0), st.integers(0, 9)),
        min_size=1,
        max_size=60,
    )
)
def test_evidence_stays_bounded_and_positives_are_the_best(
    outcomes: list[tuple[str, float, int]],
) -> None:
    graph = load_seed("cpu")
    for status, speedup, task in outcomes:
        graph.apply_outcome(
            Outcome(
                "cpu",
                f"cpu:t{task}",
                [START],
                [1.0],
                "vectorization",
                "omp_simd",
                status,
                True,
                status in ("improved", "not_improved"),
                speedup,
                1.0,
                0.0,
            )
        )
    node = graph.locals["omp_simd"]
    assert len(node.evidence_positive) <= EVIDENCE_BOUND
    assert len(node.evidence_negative) <= EVIDENCE_BOUND
    improved = [sp for status, sp, _ in outcomes if status == "improved"]
    if improved:
        assert node.evidence_positive[0].speedup == max(improved)
    assert node.stats.attempts == len(outcomes)


def test_no_transitions_ignores_edges_and_random_is_uniform() -> None:
    graph, s = load_seed("cuda"), state()
    plain = select_global(graph, [START], s, PolicyConfig(mode="no_transitions"), random.Random(1))
    assert all(c.edge_terms == [] for c in plain.candidates)
    uniform = select_global(graph, [START], s, PolicyConfig(mode="random"), random.Random(1))
    fitting = {n.parent for n in graph.locals.values() if n.fits(s.family, s.tags()) is None}
    assert {c.id for c in uniform.candidates} == fitting  # only directions that fit
    assert {round(c.probability, 12) for c in uniform.candidates} == {round(1 / len(fitting), 12)}


def test_greedy_takes_the_top_direction_without_edges_or_sampling() -> None:
    graph, s = load_seed("cpu"), state("cpu", family="reduction", features={"loops"})
    chosen = {
        select_global(graph, [START], s, PolicyConfig(mode="greedy"), random.Random(seed)).chosen
        for seed in range(20)
    }
    decision = select_global(graph, [START], s, PolicyConfig(mode="greedy"), random.Random(0))
    top = max(decision.candidates, key=lambda c: c.score)
    assert chosen == {top.id}
    assert all(c.edge_terms == [] for c in decision.candidates)
    assert sorted(c.probability for c in decision.candidates)[-2:] == [0.0, 1.0]


def test_flat_mode_chooses_a_local_and_its_parent() -> None:
    graph = load_seed("cuda")
    decision = select_global(graph, [START], state(), PolicyConfig(mode="flat"), random.Random(3))
    assert decision.chosen_local in graph.locals
    assert graph.locals[decision.chosen_local].parent == decision.chosen
    s = state()
    fitting = [n for n in graph.locals.values() if n.fits(s.family, s.tags()) is None]
    assert len(decision.candidates) == len(fitting) < len(graph.locals)


def test_recent_steps_weigh_more_and_improving_steps_gain_attention() -> None:
    path = [
        PathEntry("memory_access", "a", "not_improved"),
        PathEntry("data_reuse", "b", "not_improved"),
        PathEntry("compute_throughput", "c", "not_improved"),
    ]
    decision = select_global(
        GRAPHS["cuda"], make_prefix(path, 3), state(path=path), PolicyConfig(), random.Random(0)
    )
    assert decision.alphas[0] < decision.alphas[1] < decision.alphas[2]
    path[0] = PathEntry("memory_access", "a", "improved")
    boosted = select_global(
        GRAPHS["cuda"], make_prefix(path, 3), state(path=path), PolicyConfig(), random.Random(0)
    )
    assert boosted.alphas[0] > decision.alphas[0]


def test_local_selector_prefers_applicable_mechanical_and_explains_blocked() -> None:
    graph = load_seed("cuda")
    blocked = {"vectorized_float4": "pointers not known to be aligned"}
    decision = EvidenceLocalSelector().choose(graph, "memory_access", state(), blocked)
    assert decision.local_id == "restrict_const"
    assert decision.ranking[-1] == (
        "vectorized_float4",
        -math.inf,
        "not applicable: pointers not known to be aligned",
    )
    everything = {n.id: "blocked for this test" for n in graph.locals_of("memory_access")}
    with pytest.raises(NoApplicableStrategy, match="blocked for this test"):
        EvidenceLocalSelector().choose(graph, "memory_access", state(), everything)


def test_a_compound_rewrite_wins_a_tie_among_mechanical_strategies() -> None:
    """Equal scores: the rewrite bundling edits that only pay together is tried first,
    whatever the ids' order."""
    graph = load_seed("cpu")
    graph.locals = {
        node.id: node
        for node in (
            LocalNode("a_single", "vectorization", "single", "", mechanical="cpu.omp_simd"),
            LocalNode("z_bundle", "vectorization", "bundle", "", mechanical="cpu.vector_math"),
            LocalNode("b_plain", "vectorization", "plain", "", mechanical="cpu.restrict"),
        )
    }
    decision = EvidenceLocalSelector().choose(graph, "vectorization", state("cpu"), {})
    assert [lid for lid, *_ in decision.ranking] == ["z_bundle", "a_single", "b_plain"]


def test_evidence_overtakes_the_mechanical_tie_break() -> None:
    """Mechanical strategies only break ties: what the memory learned decides."""
    graph = load_seed("cuda")
    prefix = [START] * 3
    for local, speedup in [("restrict_const", 0.9), ("coalesced_indexing", 1.6)] * 3:
        status = "improved" if speedup > 1 else "not_improved"
        graph.apply_outcome(
            Outcome(
                "cuda",
                "cuda:other:f32",
                prefix,
                [1 / 3] * 3,
                "memory_access",
                local,
                status,
                True,
                True,
                speedup,
                1.0,
                reward(status, speedup),
                "code",
            )
        )
    untagged = state(features=set())  # no tag favours either strategy
    decision = EvidenceLocalSelector().choose(graph, "memory_access", untagged, {})
    assert decision.local_id == "coalesced_indexing"
    assert not graph.locals["coalesced_indexing"].mechanical


def test_reward_is_log_speedup_when_correct_and_a_penalty_otherwise() -> None:
    assert reward("improved", 2.0) == pytest.approx(math.log(2.0))
    assert reward("not_improved", 0.5) < 0 < reward("improved", 1.1)
    assert reward("not_improved", None) == 0.0
    assert reward("incorrect", 3.0) == Status.INCORRECT.info.penalty < reward("compile_error", None)
    with pytest.raises(ValueError):
        reward("bogus", 1.0)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        PolicyConfig(mode="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PolicyConfig(tau=0)
