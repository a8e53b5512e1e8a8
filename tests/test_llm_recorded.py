"""Real, messy answers of small local models (tests/fixtures/llm/*.jsonl) through the
choice parser, the local selector and code extraction: every answer is either used or
rejected with a reason, and nothing invalid is ever chosen or compiled.

The cassettes of prompted JSON (`PROMPTED`) are what a small model writes unconstrained:
no valid choice. `GRAMMAR` is the same model held to the choice schema by llama.cpp's
grammar (`json_grammar`): every choice names an offered id. Any further cassette is
replayed by the tests that hold for every real answer."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import LIMITS, extract_candidate, extract_json, make_provider, parse_choice
from htam_engine.llm.measure import CODE_PURPOSES, measure
from htam_engine.llm.measure import main as measure_main
from htam_engine.llm.remote import GRAMMAR_STRING_CHARS
from htam_engine.llm.replay import read_cassette
from htam_engine.memory.model import Graph, load_seed
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import State

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
CASSETTES = sorted(FIXTURES.glob("*.jsonl"))
# Prompted JSON, 4,096 tokens a call, no latency recorded (before structured output).
PROMPTED = ("gemma3-270m-base-softmax-cpu.jsonl", "smollm2-135m-softmax-cpu.jsonl")
# benchmarks/local_llm.py: SmolLM2-135M on llama-cpp-python's server, grammar-constrained.
GRAMMAR = "smollm2-135m-json-grammar-softmax-cpu.jsonl"
CANDIDATE = re.compile(r"^### (\S+)$", re.M)  # "### <id>" heads each candidate's section
FENCE = re.compile(r"in one ```(\w+) block")  # the language a code prompt asks for


def entries(*purposes: str, names: Sequence[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(cassette:line, entry) for each recorded call of one of `purposes`, in the
    cassettes named (all of them by default)."""
    found = []
    for cassette in CASSETTES if names is None else [FIXTURES / n for n in names]:
        for number, line in enumerate(cassette.read_text(encoding="utf-8").splitlines()):
            entry = json.loads(line)
            if entry["purpose"] in purposes:
                found.append((f"{cassette.stem}:{number}", entry))
    return found


def offered(entry: dict[str, Any]) -> list[str]:
    """The runnable ids the recorded prompt offered (a candidate's title line, `### Name
    (id)`, also starts with ###, but names no id on its own)."""
    return [m for m in CANDIDATE.findall(entry["prompt"]) if "(" not in m]


def fitting(graph: Graph, entry: dict[str, Any]) -> list[str]:
    """The offered ids that fit the recorded kernel (what the selector offers today)."""
    state = recorded_state(entry)
    return [i for i in offered(entry) if graph.locals[i].fits(state.family, state.tags()) is None]


def recorded_state(entry: dict[str, Any]) -> State:
    """The state a recorded choice prompt describes (its family and feature tags)."""
    prompt = entry.get("prompt", "")
    family = re.search(r"family=(\w+)", prompt)
    features = re.search(r"^features: (.*)$", prompt, re.M)
    tags = {t.strip() for t in features.group(1).split(",")} if features else set()
    return State(
        backend="cpu",
        family=family.group(1) if family else "reduction",
        task_signature="cpu:reduction:softmax",
        features=tags - {"none"},
    )


def language(entry: dict[str, Any]) -> str:
    """The language a code prompt asked for (as `measure` reads it)."""
    asked = FENCE.findall(entry.get("prompt", ""))
    return asked[-1] if asked else "python"


CHOICES = entries("local")
PROMPTED_CHOICES = entries("local", names=PROMPTED)
GRAMMAR_CHOICES = entries("local", names=[GRAMMAR])
GENERATIONS = entries("generate")
PROMPTED_GENERATIONS = entries("generate", names=PROMPTED)
CODE = entries(*CODE_PURPOSES)  # every answer that should be code


def test_the_fixtures_are_the_recorded_runs() -> None:
    assert {*PROMPTED, GRAMMAR} <= {c.name for c in CASSETTES}
    assert len(PROMPTED_CHOICES) >= 7 and len(GENERATIONS) >= 2
    assert len(GRAMMAR_CHOICES) >= 4
    assert all(offered(entry) for _, entry in CHOICES)
    assert all(e.get("form", "prompted") == "prompted" for _, e in PROMPTED_CHOICES)
    assert all(e["form"] == "json_grammar" for _, e in GRAMMAR_CHOICES)


@pytest.mark.parametrize(("where", "entry"), CHOICES, ids=[w for w, _ in CHOICES])
def test_a_recorded_choice_never_yields_an_id_that_was_not_offered(
    where: str, entry: dict[str, Any]
) -> None:
    runnable = offered(entry)
    choice = parse_choice(entry["text"], runnable)
    assert choice is None or choice.local_id in runnable


def test_template_echoes_are_what_the_old_first_object_parser_returned() -> None:
    """The old reading (first JSON object) took the echoed template for an answer."""
    echoed = [e for _, e in CHOICES if (extract_json(e["text"]) or {}).get("local") == "<id>"]
    assert len(echoed) >= 3
    for entry in echoed:
        assert parse_choice(entry["text"], offered(entry)) is None


@pytest.mark.parametrize(("where", "entry"), CHOICES[:3], ids=[w for w, _ in CHOICES[:3]])
def test_a_real_answer_after_a_real_echo_wins(where: str, entry: dict[str, Any]) -> None:
    """The real messy text, then the answer a constrained run gives: the answer is read."""
    runnable = offered(entry)
    answer = json.dumps({"local": runnable[-1], "reason": "named after the echo"})
    choice = parse_choice(entry["text"] + "\n" + answer, runnable, "json_object")
    assert choice is not None
    assert (choice.local_id, choice.reason, choice.form) == (
        runnable[-1],
        "named after the echo",
        "json_object",
    )


def test_the_selector_falls_back_with_a_reason_on_every_recorded_choice(tmp_path: Path) -> None:
    """Replay each recorded choice prompt through the selector with the real cpu seed."""
    graph = load_seed("cpu")
    cassette = tmp_path / "choices.jsonl"
    usable = [e for _, e in PROMPTED_CHOICES if set(offered(e)) <= set(graph.locals)]
    usable = [e for e in usable if fitting(graph, e)]  # some offered only misfits
    assert usable, "the seed no longer has the recorded strategies"
    cassette.write_text("".join(json.dumps(e) + "\n" for e in usable))
    provider, _ = make_provider("replay", cassette=cassette, env={})
    assert provider is not None
    selector = LLMLocalSelector(provider)
    for entry in usable:
        runnable = offered(entry)
        direction = graph.locals[runnable[0]].parent
        state = recorded_state(entry)
        runnable = fitting(graph, entry)
        applicable = {
            node.id: None if node.id in runnable else "not offered in the recording"
            for node in graph.locals_of(direction)
        }
        decision = selector.choose(graph, direction, state, applicable)
        assert decision.local_id in runnable
        assert selector.last is not None and not selector.last.valid
        assert selector.last.form == "prompted"
        assert "named no runnable strategy" in decision.reason
        assert "evidence ranking used" in decision.reason


@pytest.mark.parametrize(("where", "entry"), CODE, ids=[w for w, _ in CODE])
def test_a_recorded_generation_is_used_or_rejected_with_a_reason(
    where: str, entry: dict[str, Any]
) -> None:
    truncated = bool(entry.get("truncated", False))
    answer = extract_candidate(entry["text"], language(entry), truncated=truncated)
    if answer.code is None:
        assert answer.reason
    else:
        assert answer.reason == ""
        if language(entry) == "python":
            assert "class ModelNew" in answer.code


def test_the_empty_recorded_answer_is_rejected_as_empty() -> None:
    empty = [e for _, e in GENERATIONS if not e["text"].strip()]
    assert empty
    assert extract_candidate(empty[0]["text"], "python").reason == "empty answer"


def test_a_recorded_answer_cut_off_in_the_class_header_is_never_compiled() -> None:
    """A real answer cut where a model at its token limit stops: the class header."""
    text = next(e["text"] for _, e in PROMPTED_GENERATIONS if "class ModelNew" in e["text"])
    cut = text[: text.index("class ModelNew")] + "class ModelNew(nn.Module):"
    answer = extract_candidate(cut, "python", truncated=True)
    assert answer.code is None
    assert "does not parse" in answer.reason and "max_tokens" in answer.reason
    body_cut = text[: text.index("def forward")]
    assert extract_candidate(body_cut, "python").reason == "ModelNew has no forward method"


def test_a_recorded_answer_that_ran_to_the_limit_gives_no_code() -> None:
    longest = max((e for _, e in PROMPTED_CHOICES), key=lambda e: e["output_tokens"])
    assert longest["output_tokens"] >= 4096
    answer = extract_candidate(longest["text"], "python", truncated=True)
    assert answer.code is None and "max_tokens" in answer.reason


def test_measure_counts_the_recorded_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert measure_main([*map(str, CASSETTES), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["choices"] == len(CHOICES)
    assert report["code_answers"] == len(CODE)
    assert report["code_used"] + sum(report["rejected"].values()) == len(CODE)
    assert report["valid_forms"].get("prompted") == 0, "no prompted recorded choice is valid"
    assert report["valid_forms"].get("json_grammar") == len(GRAMMAR_CHOICES)
    empty = sum(not e["text"].strip() for _, e in CODE)
    assert empty >= 1 and report["rejected"].get("empty answer") == empty
    assert report["output_tokens"] == sum(
        int(e.get("output_tokens", 0)) for c in CASSETTES for e in read_cassette(c)
    )


def test_measure_tells_the_last_object_from_the_first(tmp_path: Path) -> None:
    """An echoed template, then a real answer: only the new reading counts it valid."""
    echo = next(e for _, e in CHOICES if '"local": "<id>"' in e["text"])
    answer = json.dumps({"local": offered(echo)[0], "reason": "r"})
    cassette = tmp_path / "c.jsonl"
    cassette.write_text(json.dumps({**echo, "text": echo["text"] + answer}) + "\n")
    report = measure([cassette])
    assert (report.choices, report.valid_choices, report.valid_first_object) == (1, 1, 0)


def test_a_replayed_answer_as_long_as_the_limit_counts_as_cut_off() -> None:
    """Older cassettes have no `truncated`: an answer as long as the call's limit was."""
    cassette = FIXTURES / "smollm2-135m-softmax-cpu.jsonl"
    replay, _ = make_provider("replay", cassette=cassette, env={})
    assert replay is not None
    purposes = ("local", "generate", "local", "local", "local")
    answers = [
        replay.complete("s", "a prompt recorded under another version", purpose=purpose)
        for purpose in purposes
    ]
    limits = [LIMITS[purpose].max_tokens for purpose in purposes]
    expected = [a.output_tokens >= limit for a, limit in zip(answers, limits, strict=True)]
    assert [a.truncated for a in answers] == expected
    assert answers[-1].truncated and not answers[1].truncated


def test_a_recording_keeps_latency_for_tokens_per_second(tmp_path: Path) -> None:
    cassette = tmp_path / "timed.jsonl"
    with ScriptedAPIServer() as server:
        server.script(Reply(text="{}", output_tokens=30, delay_s=0.2))
        recorder = sdk_provider("openai", server, record=cassette)
        recorder.complete("s", "p", purpose="local")
    report = measure([cassette])
    assert report.timed_calls == 1 and report.timed_seconds >= 0.2
    assert report.timed_output_tokens == 30
    assert report.lines()[-1].startswith("time per call: ")
    assert measure([FIXTURES / n for n in PROMPTED]).lines()[-1] == "time per call: not recorded"
    timed = measure([FIXTURES / GRAMMAR])
    assert timed.timed_calls == len(read_cassette(FIXTURES / GRAMMAR))


@pytest.mark.parametrize(("where", "entry"), GRAMMAR_CHOICES, ids=[w for w, _ in GRAMMAR_CHOICES])
def test_a_grammar_constrained_choice_is_a_valid_runnable_id(
    where: str, entry: dict[str, Any]
) -> None:
    """The real answers under llama.cpp's grammar: one object, an offered id, a bounded
    reason; the parser reads them as valid choices in their recorded form."""
    runnable = offered(entry)
    choice = parse_choice(entry["text"], runnable, entry["form"])
    assert choice is not None and choice.local_id in runnable
    assert choice.form == "json_grammar"
    value = json.loads(entry["text"])
    assert set(value) == {"local", "reason"} and value["local"] == choice.local_id
    assert len(value["reason"]) <= GRAMMAR_STRING_CHARS and not entry["truncated"]


def test_the_grammar_cassette_meets_the_issue_bar() -> None:
    """At least 90 % valid choices, every code answer used or rejected with a reason."""
    report = measure([FIXTURES / GRAMMAR])
    assert report.choices == len(GRAMMAR_CHOICES)
    assert report.valid_choices >= 0.9 * report.choices
    assert report.valid_first_object == report.valid_choices  # nothing echoed first
    assert report.choice_forms == {"json_grammar": report.choices}
    assert report.valid_forms == {"json_grammar": report.valid_choices}
    assert f"json_grammar {report.valid_choices}/{report.choices}" in report.lines()[1]
    assert report.code_used + sum(report.rejected.values()) == report.code_answers
    assert all(reason for reason in report.rejected)


def test_the_selector_uses_every_recorded_grammar_choice(tmp_path: Path) -> None:
    """Replayed through the selector with the real cpu seed: the LLM's id is taken,
    in the recorded form, with no fallback to the evidence ranking."""
    graph = load_seed("cpu")
    usable = [e for _, e in GRAMMAR_CHOICES if set(offered(e)) <= set(graph.locals)]
    usable = [e for e in usable if fitting(graph, e)]  # some offered only misfits
    assert usable, "the seed no longer has the recorded strategies"
    cassette = tmp_path / "choices.jsonl"
    cassette.write_text("".join(json.dumps(e) + "\n" for e in usable))
    provider, _ = make_provider("replay", cassette=cassette, env={})
    assert provider is not None
    selector = LLMLocalSelector(provider)
    for entry in usable:
        runnable = offered(entry)
        direction = graph.locals[runnable[0]].parent
        state = recorded_state(entry)
        runnable = fitting(graph, entry)
        applicable = {
            node.id: None if node.id in runnable else "not offered in the recording"
            for node in graph.locals_of(direction)
        }
        decision = selector.choose(graph, direction, state, applicable)
        answer = json.loads(entry["text"])["local"]
        if answer not in runnable:  # its answer does not fit: refused, the ranking picks
            assert decision.local_id in runnable and not selector.last.valid
            continue
        assert decision.local_id == answer
        assert selector.last is not None and selector.last.valid
        assert selector.last.form == "json_grammar"
        assert decision.reason.endswith("[LLM, json_grammar]")
