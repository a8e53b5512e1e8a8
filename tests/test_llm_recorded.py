"""Real, messy answers of small local models (tests/fixtures/llm/*.jsonl) through the
choice parser, the local selector and code extraction: every answer is either used or
rejected with a reason, and nothing invalid is ever chosen or compiled."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import LIMITS, extract_candidate, extract_json, make_provider, parse_choice
from htam_engine.llm.measure import main as measure_main
from htam_engine.llm.measure import measure
from htam_engine.memory.model import load_seed
from htam_engine.policy.llm_chooser import LLMLocalSelector
from htam_engine.state import State

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
CASSETTES = sorted(FIXTURES.glob("*.jsonl"))
CANDIDATE = re.compile(r"^### (\S+)$", re.M)  # "### <id>" heads each candidate's section


def entries(purpose: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for cassette in CASSETTES:
        for number, line in enumerate(cassette.read_text(encoding="utf-8").splitlines()):
            entry = json.loads(line)
            if entry["purpose"] == purpose:
                found.append((f"{cassette.stem}:{number}", entry))
    return found


def offered(entry: dict[str, Any]) -> list[str]:
    """The runnable ids the recorded prompt offered (a candidate's title line, `### Name
    (id)`, also starts with ###, but names no id on its own)."""
    return [m for m in CANDIDATE.findall(entry["prompt"]) if "(" not in m]


CHOICES = entries("local")
GENERATIONS = entries("generate")


def test_the_fixtures_are_the_recorded_runs() -> None:
    assert len(CASSETTES) == 2
    assert len(CHOICES) >= 7 and len(GENERATIONS) >= 2
    assert all(offered(entry) for _, entry in CHOICES)


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
    usable = [e for _, e in CHOICES if set(offered(e)) <= set(graph.locals)]
    assert usable, "the seed no longer has the recorded strategies"
    cassette.write_text("".join(json.dumps(e) + "\n" for e in usable))
    provider, _ = make_provider("replay", cassette=cassette, env={})
    assert provider is not None
    selector = LLMLocalSelector(provider)
    for entry in usable:
        runnable = offered(entry)
        direction = graph.locals[runnable[0]].parent
        state = State(backend="cpu", family="reduction", task_signature="cpu:reduction:softmax")
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


@pytest.mark.parametrize(("where", "entry"), GENERATIONS, ids=[w for w, _ in GENERATIONS])
def test_a_recorded_generation_is_used_or_rejected_with_a_reason(
    where: str, entry: dict[str, Any]
) -> None:
    answer = extract_candidate(entry["text"], "python")
    if answer.code is None:
        assert answer.reason
    else:
        assert answer.reason == "" and "class ModelNew" in answer.code


def test_the_empty_recorded_answer_is_rejected_as_empty() -> None:
    empty = [e for _, e in GENERATIONS if not e["text"].strip()]
    assert empty
    assert extract_candidate(empty[0]["text"], "python").reason == "empty answer"


def test_a_recorded_answer_cut_off_in_the_class_header_is_never_compiled() -> None:
    """A real answer cut where a model at its token limit stops: the class header."""
    text = next(e["text"] for _, e in GENERATIONS if "class ModelNew" in e["text"])
    cut = text[: text.index("class ModelNew")] + "class ModelNew(nn.Module):"
    answer = extract_candidate(cut, "python", truncated=True)
    assert answer.code is None
    assert "does not parse" in answer.reason and "max_tokens" in answer.reason
    body_cut = text[: text.index("def forward")]
    assert extract_candidate(body_cut, "python").reason == "ModelNew has no forward method"


def test_a_recorded_answer_that_ran_to_the_limit_gives_no_code() -> None:
    longest = max((e for _, e in CHOICES), key=lambda e: e["output_tokens"])
    assert longest["output_tokens"] >= 4096
    answer = extract_candidate(longest["text"], "python", truncated=True)
    assert answer.code is None and "max_tokens" in answer.reason


def test_measure_counts_the_recorded_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert measure_main([*map(str, CASSETTES), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["choices"] == len(CHOICES)
    assert report["code_answers"] == len(GENERATIONS)
    assert report["code_used"] + sum(report["rejected"].values()) == len(GENERATIONS)
    assert report["rejected"].get("empty answer") == 1
    assert report["output_tokens"] == sum(
        e["output_tokens"] for c in (CHOICES, GENERATIONS) for _, e in c
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
    cassette = next(c for c in CASSETTES if c.name.startswith("smollm2"))
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
    assert measure(CASSETTES).lines()[-1] == "time per call: not recorded"
