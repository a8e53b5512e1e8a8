"""The curated seed memory: counts, structure and vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from htam_engine.memory import START, load_seed
from htam_engine.strategies import REGISTRY
from htam_engine.vocabulary import BACKENDS, state_tags

MIN_COUNTS = {"cuda": (7, 35), "cpu": (5, 15), "triton": (6, 15)}
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


def _doc_section(title: str) -> set[str]:
    """The backquoted words of one section of docs/ARCHITECTURE.md (the shared vocabulary)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([a-z_.A-Z0-9]+)`", section))


@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_has_enough_directions_and_strategies(backend: str) -> None:
    graph = load_seed(backend)
    min_globals, min_locals = MIN_COUNTS[backend]
    assert len(graph.globals) >= min_globals
    assert len(graph.locals) >= min_locals
    assert graph.seed_version


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_local_has_one_existing_parent_and_every_direction_has_strategies(
    backend: str,
) -> None:
    graph = load_seed(backend)
    assert all(node.parent in graph.globals for node in graph.locals.values())
    assert all(graph.locals_of(gid) for gid in graph.globals)


@pytest.mark.parametrize("backend", BACKENDS)
def test_edges_connect_existing_directions_and_start_leads_somewhere(backend: str) -> None:
    graph = load_seed(backend)
    for src, dst in graph.edges:
        assert src == START or src in graph.globals
        assert dst in graph.globals
    assert any(src == START for src, _ in graph.edges)
    assert all(0.0 <= edge.prior <= 1.0 and edge.why for edge in graph.edges.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_mechanical_ids_are_registered_names_of_this_backend(backend: str) -> None:
    graph = load_seed(backend)
    used = {n.mechanical for n in graph.locals.values() if n.mechanical}
    documented = {
        w
        for w in _doc_section("Mechanical strategy ids")
        if w.startswith(("cuda.", "cpu.", "triton."))
    }
    assert used <= set(REGISTRY) == documented
    assert all(m.startswith(f"{backend}.") for m in used)
    assert used == {m for m in REGISTRY if m.startswith(f"{backend}.")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_trigger_and_applicability_tag_is_one_a_state_can_carry(backend: str) -> None:
    graph = load_seed(backend)
    named = {tag for node in graph.globals.values() for tag in node.triggers}
    named |= {tag for node in graph.locals.values() for tag in node.applicability}
    assert named - state_tags(backend) == set(), "a seed names a tag that nothing produces"


def test_prompt_texts_are_bounded_and_carry_evidence() -> None:
    from htam_engine.memory import Evidence

    graph = load_seed("cuda")
    node = graph.locals["vectorized_float4"]
    node.record(Evidence("cuda:relu:f32[1M]", "improved", 1.7, 0.1, "float4 v = ...", ""))
    node.record(Evidence("cuda:add:f32[7]", "incorrect", None, None, "", "tail dropped"))
    text = node.prompt_text("elementwise")
    assert "cuda:relu:f32[1M] (1.70x)" in text and "tail dropped" in text
    assert "float4 v" not in text  # the code goes whole into the generation prompt
    example = node.example("elementwise")
    assert example is not None and example.code_excerpt == "float4 v = ..."
    assert len(text) <= 1200
    assert all(len(g.prompt_text()) <= 700 for g in graph.globals.values())
