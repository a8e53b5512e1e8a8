"""What HTAM remembers about a server and model across runs (refused forms, measured
speed), and limits fitted to that speed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import choice_schema, learned
from htam_engine.llm.limits import LOCAL_DEADLINE_S, CallLimit, adapt


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def choose(provider: object) -> None:
    provider.complete("s", "p", purpose="local", schema=choice_schema(["a", "b"]))  # type: ignore[attr-defined]


def test_a_refused_form_costs_one_request_once_not_once_per_run(
    server: ScriptedAPIServer, htam_home: Path
) -> None:
    server.script(Reply(status=500), Reply(text='{"local": "a", "reason": "r"}'))
    choose(sdk_provider("openai", server))
    kinds = [r.body["response_format"]["type"] for r in server.requests]
    assert kinds == ["json_schema", "json_object"]  # refused, then the grammar form
    server.script(Reply(text='{"local": "b", "reason": "r"}'))
    again = sdk_provider("openai", server)  # a new run: a new provider instance
    assert again.forms[0] == "json_grammar"  # type: ignore[attr-defined]
    choose(again)
    assert server.requests[-1].body["response_format"]["type"] == "json_object"
    assert len(server.requests) == 3
    kept = json.loads((htam_home / "llm" / learned.FILE).read_text())
    assert [v["refused_forms"] for v in kept.values()] == [["json_schema"]]


def test_forms_are_kept_per_base_url_and_model(htam_home: Path) -> None:
    one = learned.server_key("openai", "http://127.0.0.1:1/v1", "small")
    learned.refuse_form(one, "json_schema")
    forms = ("json_schema", "json_grammar", "prompted")
    assert learned.known_forms(one, forms) == ["json_grammar", "prompted"]
    other = learned.server_key("openai", "http://127.0.0.1:1/v1", "large")
    assert learned.known_forms(other, forms) == list(forms)
    for form in forms:
        learned.refuse_form(one, form)
    assert learned.known_forms(one, forms) == ["prompted"]  # the last form always stays


def test_concurrent_updates_leave_a_whole_file(htam_home: Path) -> None:
    keys = [learned.server_key("openai", None, f"m{i}") for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: learned.record_speed(k, 100, 2.0), keys * 3))
    kept = json.loads((htam_home / "llm" / learned.FILE).read_text())
    assert sorted(kept) == sorted(keys)
    assert all(v["tokens_per_s"] == pytest.approx(50.0) for v in kept.values())
    assert learned.record_speed(keys[0], 3, 1.0) == pytest.approx(50.0)  # too short to count


def test_limits_fit_a_slow_local_model_and_bound_a_slow_paid_one() -> None:
    base = CallLimit(max_tokens=6144, deadline_s=300.0)
    assert adapt(base, None, local=True) == base
    assert adapt(base, 100.0, local=False) == base  # fast enough already
    local = adapt(base, 14.0, local=True)  # SmolLM2 on 2 shared cores
    assert local.max_tokens == 6144 and local.deadline_s == pytest.approx(6144 * 1.25 / 14)
    crawl = adapt(base, 2.0, local=True)
    assert crawl.deadline_s == LOCAL_DEADLINE_S and crawl.max_tokens == int(2 * 1800 / 1.25)
    paid = adapt(base, 14.0, local=False)
    assert paid.deadline_s == 300.0 and paid.max_tokens == int(14 * 300 / 1.25)


def test_a_measured_slow_server_gets_a_deadline_it_can_finish(
    server: ScriptedAPIServer, htam_home: Path
) -> None:
    server.script(Reply(text="y " * 40, output_tokens=40, piece_delay_s=0.2), Reply())
    provider = sdk_provider("openai", server)
    provider.complete("s", "p", purpose="generate")
    rate = learned.tokens_per_s(provider.server)  # type: ignore[attr-defined]
    assert rate is not None and rate < 25.0  # measured from the call, whatever its pieces
    provider.complete("s", "p2", purpose="generate")
    fitted = adapt(CallLimit(6144, 300.0), rate, local=True)
    assert fitted.deadline_s > 300.0  # 6,144 tokens at this speed need longer than 300 s
    assert server.requests[-1].body["max_tokens"] == fitted.max_tokens == 6144
