"""The official anthropic and openai SDKs against a real local HTTP server."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.llm_api_server import ANTHROPIC_PATH, OPENAI_PATH, Reply, ScriptedAPIServer

from htam_engine.llm import LLMError, Provider, RetryPolicy, load_prices, make_provider
from htam_engine.llm.remote import retry_after_s

KIND = ["anthropic", "openai"]
PATHS = {"anthropic": ANTHROPIC_PATH, "openai": OPENAI_PATH}


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def provider(
    kind: str,
    server: ScriptedAPIServer,
    *,
    key: str = "sk-test-0123456789abcdef",
    cache: bool = False,
    retry: RetryPolicy | None = None,
    record: Path | None = None,
    env: dict[str, str] | None = None,
) -> Provider:
    env = {("ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY"): key, **(env or {})}
    url = server.url if kind == "anthropic" else server.url + "/v1"
    made, _line = make_provider(
        kind, base_url=url, env=env, cache=cache, retry=retry, record=record
    )
    assert made is not None
    return made


def fast_retry(
    attempts: int = 3, sleeps: list[float] | None = None, timeout_s: float = 10.0
) -> RetryPolicy:
    """Tiny backoff; `sleeps` (when given) records delays instead of sleeping."""
    sleep = sleeps.append if sleeps is not None else time.sleep
    return RetryPolicy(attempts=attempts, base_s=0.01, timeout_s=timeout_s, sleep=sleep)


@pytest.mark.parametrize("kind", KIND)
def test_success_tokens_and_cost(kind: str, server: ScriptedAPIServer) -> None:
    server.script(Reply(text="hello kernel", input_tokens=1234, output_tokens=567))
    llm = provider(kind, server)
    completion = llm.complete("be fast", "write a kernel", max_tokens=99, purpose="generate")
    assert completion.text == "hello kernel"
    assert (completion.input_tokens, completion.output_tokens) == (1234, 567)
    price = load_prices().price(llm.model)
    assert price is not None
    assert completion.cost_usd == pytest.approx((1234 * price.input + 567 * price.output) / 1e6)
    assert not completion.cached and completion.latency_s > 0
    request = server.requests[0]
    assert request.path == PATHS[kind]
    assert request.body["max_tokens"] == 99
    sent = str(request.body)
    assert "be fast" in sent and "write a kernel" in sent
    assert llm.usage.calls == 1 and llm.usage.by_purpose["generate"] == completion.cost_usd


@pytest.mark.parametrize("kind", KIND)
def test_run_totals_and_price_override(
    kind: str, server: ScriptedAPIServer, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."my-model"]\ninput = 1000.0\noutput = 2000.0\n')
    server.script(
        Reply(input_tokens=10, output_tokens=20), Reply(input_tokens=30, output_tokens=40)
    )
    llm = provider(kind, server, env={"HTAM_PRICES": str(prices), "HTAM_LLM_MODEL": "my-model"})
    first = llm.complete("s", "p1")
    second = llm.complete("s", "p2")
    assert first.cost_usd == pytest.approx((10 * 1000 + 20 * 2000) / 1e6)
    assert llm.usage.cost_usd == pytest.approx(first.cost_usd + second.cost_usd)
    assert (llm.usage.input_tokens, llm.usage.output_tokens) == (40, 60)


def test_bad_price_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "prices.json"
    bad.write_text('{"models": {"m": {"input": "cheap"}}}')
    with pytest.raises(LLMError, match="needs numeric 'input' and 'output'"):
        load_prices({"HTAM_PRICES": str(bad)})


@pytest.mark.parametrize("kind", KIND)
def test_429_honours_retry_after_then_succeeds(kind: str, server: ScriptedAPIServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=429, headers={"retry-after": "3"}), Reply(text="finally"))
    llm = provider(kind, server, retry=fast_retry(sleeps=sleeps))
    assert llm.complete("s", "p").text == "finally"
    assert sleeps == [3.0]
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KIND)
def test_500_backs_off_exponentially_with_jitter(kind: str, server: ScriptedAPIServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=500), Reply(status=503), Reply(text="up"))
    llm = provider(kind, server, retry=fast_retry(attempts=3, sleeps=sleeps))
    assert llm.complete("s", "p").text == "up"
    assert len(sleeps) == 2
    assert 0.01 <= sleeps[0] <= 0.02 and 0.02 <= sleeps[1] <= 0.03


def test_retry_after_ms_really_waits(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=429, headers={"retry-after-ms": "300"}), Reply(text="ok"))
    llm = provider("openai", server, retry=fast_retry())
    started = time.perf_counter()
    llm.complete("s", "p")
    assert time.perf_counter() - started >= 0.3


@pytest.mark.parametrize("kind", KIND)
def test_retries_exhausted_is_llm_error(
    kind: str, server: ScriptedAPIServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(*(Reply(status=500) for _ in range(3)))
    llm = provider(kind, server, retry=fast_retry(attempts=3, sleeps=[]))
    with (
        caplog.at_level(logging.WARNING, logger="htam.llm"),
        pytest.raises(LLMError, match=r"HTTP 500.*gave up after 3 attempts"),
    ):
        llm.complete("s", "p")
    assert len(server.requests) == 3
    assert sum("retry" in record.getMessage() for record in caplog.records) == 2


@pytest.mark.parametrize("kind", KIND)
def test_client_error_is_not_retried(kind: str, server: ScriptedAPIServer) -> None:
    server.script(Reply(status=400))
    llm = provider(kind, server, retry=fast_retry(sleeps=[]))
    with pytest.raises(LLMError, match="HTTP 400"):
        llm.complete("s", "p")
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", KIND)
def test_timeout_is_retried_then_reported(kind: str, server: ScriptedAPIServer) -> None:
    server.script(Reply(delay_s=1.0), Reply(delay_s=1.0))
    llm = provider(kind, server, retry=fast_retry(attempts=2, sleeps=[], timeout_s=0.2))
    with pytest.raises(LLMError, match="timed out; gave up after 2 attempts"):
        llm.complete("s", "p")
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KIND)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'event: message_start\ndata: {"id": "x", "content": [tru\n\n', "malformed JSON"),
        (b": a comment and no event\n\n", "unexpected .* response"),
        (b"event: message_start\ndata: null\n\n", "unexpected .* stream"),
        (
            b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": 7, '
            b'"choices": [{"delta": 7}]}\n\n',
            "unexpected .* stream",
        ),
    ],
)
def test_malformed_body(kind: str, body: bytes, message: str, server: ScriptedAPIServer) -> None:
    server.script(Reply(raw_body=body))
    llm = provider(kind, server, retry=fast_retry(sleeps=[]))
    with pytest.raises(LLMError, match=message):
        llm.complete("s", "p")
    assert len(server.requests) == 1


def test_connection_refused_is_retried_then_reported() -> None:
    with ScriptedAPIServer() as server:
        url = server.url
    sleeps: list[float] = []
    made, _ = make_provider(
        "openai", base_url=url + "/v1", env={}, cache=False, retry=fast_retry(2, sleeps)
    )
    assert made is not None
    with pytest.raises(LLMError, match="connection failed.*gave up after 2 attempts"):
        made.complete("s", "p")
    assert len(sleeps) == 1


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"retry-after": "7"}, 7.0, 7.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, float("-inf"), 0.0),
    ],
)
def test_retry_after_forms(headers: dict[str, str], low: float, high: float) -> None:
    value = retry_after_s(headers)
    assert value is not None and low <= value <= high


def test_unparsable_retry_after_falls_back_to_backoff() -> None:
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


@pytest.mark.parametrize("kind", KIND)
def test_cache_hit_on_second_call(kind: str, server: ScriptedAPIServer, htam_home: Path) -> None:
    server.script(Reply(text="cached answer", input_tokens=50, output_tokens=5))
    first = provider(kind, server, cache=True).complete("s", "same prompt")
    second = provider(kind, server, cache=True).complete("s", "same prompt")
    assert len(server.requests) == 1
    assert second.text == first.text == "cached answer"
    assert second.cached and second.cost_usd == 0.0 and second.input_tokens == 50
    assert any((htam_home / "llm-cache").iterdir())
    provider(kind, server, cache=True).complete("s", "another prompt")
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KIND)
def test_record_then_replay_without_server(kind: str, tmp_path: Path) -> None:
    cassette = tmp_path / "run.jsonl"
    with ScriptedAPIServer() as server:
        server.script(Reply(text="answer A"), Reply(text="answer B"))
        recorder = provider(kind, server, record=cassette)
        recorder.complete("sys", "prompt A", purpose="local")
        recorder.complete("sys", "prompt B", purpose="generate")
    replay, line = make_provider("replay", cassette=cassette, env={})
    assert replay is not None and line.startswith(f"replay from {cassette}")
    assert replay.complete("sys", "prompt B").text == "answer B"  # by prompt hash
    assert replay.complete("sys", "measured 1.23 ms").text == "answer A"  # sequential fallback
    with pytest.raises(LLMError, match="no answer left"):
        replay.complete("sys", "prompt A")


def test_replay_falls_back_to_an_answer_of_the_same_purpose(tmp_path: Path) -> None:
    cassette = tmp_path / "run.jsonl"
    entries = [("local", '{"local": "x"}'), ("generate", "```python\ncode\n```")]
    cassette.write_text("".join(json.dumps({"purpose": p, "text": t}) + "\n" for p, t in entries))
    replay, _ = make_provider("replay", cassette=cassette, env={})
    assert replay is not None
    assert replay.complete("sys", "new prompt", purpose="generate").text.startswith("```")
    assert replay.complete("sys", "other prompt", purpose="local").text == '{"local": "x"}'


def test_bad_cassettes_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LLMError, match="cannot read cassette"):
        make_provider("replay", cassette=tmp_path / "missing.jsonl", env={})
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(LLMError, match="line 2: not a JSON object"):
        make_provider("replay", cassette=broken, env={})


@pytest.mark.parametrize("kind", KIND)
def test_api_key_never_written(kind: str, tmp_path: Path, htam_home: Path) -> None:
    key = (
        "sk-ant-api03-" + secrets.token_hex(24)
        if kind == "anthropic"
        else "sk-" + secrets.token_hex(24)
    )
    cassette = tmp_path / "out" / "cassette.jsonl"
    log_file = tmp_path / "out" / "llm.log"
    log_file.parent.mkdir(parents=True)
    handler = logging.FileHandler(log_file)
    logger = logging.getLogger("htam.llm")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with ScriptedAPIServer() as server:
            server.script(
                Reply(status=429, headers={"retry-after": "0"}),
                Reply(text="fine"),
                Reply(status=401),
            )
            llm = provider(
                kind, server, key=key, cache=True, record=cassette, retry=fast_retry(sleeps=[])
            )
            llm.complete("s", f"my key is {key}, do not leak it")
            with pytest.raises(LLMError) as failure:
                llm.complete("s", "second")
            auth = server.requests[0].headers
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert key in str(auth), "the key must really have been sent"
    assert key not in str(failure.value)
    written = [p for root in (tmp_path / "out", htam_home) for p in root.rglob("*") if p.is_file()]
    assert cassette in written and log_file in written
    assert any(p.parent.name == "llm-cache" for p in written)
    for path in written:
        assert key.encode() not in path.read_bytes(), f"{path} contains the API key"
