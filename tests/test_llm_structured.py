"""Structured choices over the wire: which form each provider asks for, the fallback
order when a server refuses one, and the parser that reads looser forms."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import LLMError, choice_schema, make_provider, parse_choice
from htam_engine.llm.remote import GRAMMAR_STRING_CHARS
from htam_engine.llm.structured import bounded_strings
from htam_engine.memory.model import load_seed
from htam_engine.policy import OTHER
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import State

IDS = ["omp_simd", "restrict_pointers", "soa_layout"]
SCHEMA = choice_schema(IDS)
ANSWER = {"local": "restrict_pointers", "reason": "aliasing blocks vectorization"}


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def answer(**kw: object) -> Reply:
    return Reply(text=json.dumps(ANSWER), tool_input=ANSWER, **kw)  # type: ignore[arg-type]


def response_formats(server: ScriptedAPIServer) -> list[str | None]:
    return [(r.body.get("response_format") or {}).get("type") for r in server.requests]


def test_openai_asks_for_a_json_schema_with_the_runnable_ids(server: ScriptedAPIServer) -> None:
    server.script(answer())
    completion = sdk_provider("openai", server).complete("s", "p", purpose="local", schema=SCHEMA)
    assert completion.form == "json_schema"
    sent = server.requests[0].body["response_format"]["json_schema"]
    assert sent["schema"]["properties"]["local"]["enum"] == IDS and sent["strict"] is True
    assert server.requests[0].body["max_tokens"] == 256
    assert parse_choice(completion.text, IDS, completion.form) is not None


def test_openai_falls_back_in_order_and_remembers(server: ScriptedAPIServer) -> None:
    """llama.cpp answers json_schema with HTTP 500; vLLM may refuse json_object with 400."""
    server.script(Reply(status=500), Reply(status=400), Reply(status=400), answer(), answer())
    llm = sdk_provider("openai", server)
    first = llm.complete("s", "p", purpose="local", schema=SCHEMA)
    assert first.form == "prompted"
    assert response_formats(server) == ["json_schema", "json_object", "json_object", None]
    assert "schema" in server.requests[1].body["response_format"]
    assert "schema" not in server.requests[2].body["response_format"]
    prompted = server.requests[3].body["messages"][0]["content"]
    assert all(i in prompted for i in IDS), "the looser forms spell the schema out"
    second = llm.complete("s", "p2", purpose="local", schema=SCHEMA)
    assert second.form == "prompted" and response_formats(server)[4:] == [None]


def test_openai_grammar_after_a_refused_json_schema(server: ScriptedAPIServer) -> None:
    """llama-cpp-python's server: json_schema is a 500, `json_object` with a `schema`
    is compiled to a grammar, so the enum of runnable ids is enforced."""
    server.script(Reply(status=500), answer())
    completion = sdk_provider("openai", server).complete("s", "p", schema=SCHEMA)
    assert completion.form == "json_grammar"
    assert response_formats(server) == ["json_schema", "json_object"]
    sent = server.requests[1].body["response_format"]
    assert set(sent) == {"type", "schema"}
    assert sent["schema"]["properties"]["local"] == {"type": "string", "enum": IDS}
    assert sent["schema"]["required"] == ["local", "reason"]
    assert sent["schema"]["properties"]["reason"]["maxLength"] == GRAMMAR_STRING_CHARS
    assert "maxLength" not in json.dumps(server.requests[0].body["response_format"])


def test_openai_grammar_refused_costs_one_request(server: ScriptedAPIServer) -> None:
    """A server that also refuses the schema key (HTTP 500) falls back to plain
    json_object, once: later calls go straight to the form that worked."""
    server.script(Reply(status=500), Reply(status=500), answer(), answer(), answer())
    llm = sdk_provider("openai", server)
    forms = [llm.complete("s", f"p{i}", schema=SCHEMA).form for i in range(3)]
    assert forms == ["json_object"] * 3
    sent = [r.body["response_format"] for r in server.requests]
    assert [(f["type"], "schema" in f) for f in sent] == [
        ("json_schema", False),
        ("json_object", True),
        *[("json_object", False)] * 3,
    ]
    assert llm.forms == ["json_object", "prompted"]  # type: ignore[attr-defined]


def test_a_rate_limit_is_retried_in_the_same_form(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=429, headers={"retry-after": "0"}), answer())
    completion = sdk_provider("openai", server).complete("s", "p", schema=SCHEMA)
    assert completion.form == "json_schema"
    assert response_formats(server) == ["json_schema", "json_schema"]


def test_the_last_form_is_not_dropped_but_retried_then_reported(
    server: ScriptedAPIServer,
) -> None:
    server.script(*(Reply(status=500) for _ in range(6)))
    llm = sdk_provider("openai", server)
    with pytest.raises(LLMError, match="HTTP 500.*gave up after 3 attempts"):
        llm.complete("s", "p", schema=SCHEMA)
    assert response_formats(server) == ["json_schema", "json_object", "json_object", *[None] * 3]
    assert llm.forms == ["prompted"]  # type: ignore[attr-defined]


def test_anthropic_forces_a_tool_with_the_enum(server: ScriptedAPIServer) -> None:
    server.script(answer())
    completion = sdk_provider("anthropic", server).complete("s", "p", schema=SCHEMA)
    assert completion.form == "tool"
    assert json.loads(completion.text) == ANSWER
    body = server.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": SCHEMA.name}
    assert body["tools"][0]["input_schema"]["properties"]["local"]["enum"] == IDS


def test_anthropic_falls_back_to_prompted_json(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=400), answer())
    completion = sdk_provider("anthropic", server).complete("s", "p", schema=SCHEMA)
    assert completion.form == "prompted"
    assert "tools" not in server.requests[1].body
    assert "restrict_pointers" in server.requests[1].body["system"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"local": "<id>", "reason": "<one line>"} then {"local": "soa_layout"}', "soa_layout"),
        ('{"local": "omp_simd"} no, better: {"local": "soa_layout", "reason": "r"}', "soa_layout"),
        ('{"local": "soa_layout"} and an echo {"local": "<id>"}', "soa_layout"),
        ('{"strategy": "omp_simd", "reason": "simple loops"}', "omp_simd"),
        ('```json\n{"answer": {"local": " omp_simd "}}\n```', "omp_simd"),
        ("{'local': 'restrict_pointers', 'reason': 'aliasing',}", "restrict_pointers"),
    ],
)
def test_the_last_object_naming_a_runnable_id_wins(text: str, expected: str) -> None:
    choice = parse_choice(text, IDS)
    assert choice is not None and choice.local_id == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"local": "<id>", "reason": "<one line>"}',
        '{"local": "tiling"}',
        '{"a": "omp_simd", "b": "soa_layout"}',  # two ids, no "local": ambiguous
        "I choose omp_simd.",
        "",
    ],
)
def test_no_runnable_id_is_no_choice(text: str) -> None:
    assert parse_choice(text, IDS) is None


def test_a_choice_needs_candidates() -> None:
    with pytest.raises(ValueError, match="at least one"):
        choice_schema([])


def _choose(selector: LLMLocalSelector) -> tuple[str, str, list[str]]:
    graph = load_seed("cpu")
    direction = graph.locals["omp_simd"].parent
    features = {"loops", "nested_loops", "no_simd", "no_restrict", "low_opt"}
    state = State("cpu", "reduction", "cpu:reduction:softmax", features=features)
    fits = [n.id for n in graph.locals_of(direction) if n.fits(state.family, state.tags()) is None]
    runnable = fits  # a strategy that does not fit is never offered
    decision = selector.choose(graph, direction, state, dict.fromkeys(runnable))
    return decision.local_id, decision.reason, runnable


def test_the_selector_uses_a_structured_answer(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=500), answer())
    selector = LLMLocalSelector(sdk_provider("openai", server))
    local_id, reason, runnable = _choose(selector)
    assert local_id == "restrict_pointers" and "restrict_pointers" in runnable
    assert reason == "aliasing blocks vectorization [LLM, json_grammar]"
    assert selector.last is not None and selector.last.to_json()["valid"] is True
    enum = server.requests[0].body["response_format"]["json_schema"]["schema"]
    assert sorted(enum["properties"]["local"]["enum"]) == sorted([*runnable, OTHER])


def test_the_selector_falls_back_on_an_answer_cut_off(server: ScriptedAPIServer) -> None:
    server.script(Reply(text='{"local": "omp_s', finish="length"))
    selector = LLMLocalSelector(sdk_provider("openai", server))
    local_id, reason, runnable = _choose(selector)
    assert local_id in runnable and "evidence ranking used" in reason
    assert selector.last is not None
    assert selector.last.detail == (
        "LLM answer (json_schema (cut off at max_tokens)) named no runnable strategy"
    )


def test_the_form_is_recorded_and_replayed(server: ScriptedAPIServer, tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"
    server.script(Reply(status=500), answer())
    recorder = sdk_provider("openai", server, record=cassette)
    recorder.complete("s", "p", purpose="local", schema=SCHEMA)
    assert json.loads(cassette.read_text())["form"] == "json_grammar"
    replay, _ = make_provider("replay", cassette=cassette, env={})
    assert replay is not None
    assert replay.complete("s", "p", purpose="local", schema=SCHEMA).form == "json_grammar"


def test_concurrent_refusals_drop_a_form_once(server: ScriptedAPIServer) -> None:
    server.script(*(Reply(status=500, delay_s=0.2) for _ in range(2)), answer(), answer())
    llm = sdk_provider("openai", server)
    with ThreadPoolExecutor(max_workers=2) as pool:
        calls = [pool.submit(llm.complete, "s", f"p{i}", schema=SCHEMA) for i in range(2)]
        forms = [call.result().form for call in calls]
    assert forms == ["json_grammar", "json_grammar"]
    assert llm.forms == ["json_grammar", "json_object", "prompted"]  # type: ignore[attr-defined]


def test_a_choice_drafted_while_thinking_is_not_the_answer() -> None:
    text = '<think>maybe {"local": "omp_simd"}? no.</think>{"local": "soa_layout", "reason": "r"}'
    choice = parse_choice(text, IDS)
    assert choice is not None and choice.local_id == "soa_layout"
    assert parse_choice('<think>{"local": "omp_simd"} hmm, or', IDS) is None


def test_bounded_strings_bounds_only_free_strings() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "enum": ["a"]},
            "note": {"type": "string"},
            "short": {"type": "string", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    bounded = bounded_strings(schema, 10)
    properties = bounded["properties"]
    assert properties["id"] == {"type": "string", "enum": ["a"]}
    assert properties["note"]["maxLength"] == 10 and properties["short"]["maxLength"] == 5
    assert properties["tags"]["items"]["maxLength"] == 10
    assert "maxLength" not in schema["properties"]["note"], "the original is not changed"
