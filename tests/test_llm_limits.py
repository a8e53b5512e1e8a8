"""Bounded calls: max_tokens per purpose, the run budget, the streaming deadline that
abandons a stuck generation, which errors are retried, and honest usage accounting."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.llm_api_server import Reply, ScriptedAPIServer, sdk_provider

from htam_engine.llm import (
    LIMITS,
    BudgetExhausted,
    Completion,
    LLMError,
    OpenAIProvider,
    RetryPolicy,
    RunBudget,
    Usage,
    count_tokens,
    load_prices,
)
from htam_engine.llm.limits import REASONING_EXTRA, is_reasoning_model
from htam_engine.llm.remote import is_local_url

KIND = ["anthropic", "openai"]
DEADLINE_S = 0.5
MARGIN_S = 1.0  # thread scheduling on a busy 2-core machine


@pytest.fixture
def server() -> Iterator[ScriptedAPIServer]:
    with ScriptedAPIServer() as running:
        yield running


def quick(attempts: int = 2) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, base_s=0.01, timeout_s=DEADLINE_S, sleep=lambda _s: None)


@pytest.mark.parametrize("kind", KIND)
@pytest.mark.parametrize("purpose", sorted(LIMITS))
def test_each_purpose_asks_for_its_own_max_tokens(
    kind: str, purpose: str, server: ScriptedAPIServer
) -> None:
    sdk_provider(kind, server).complete("s", "p", purpose=purpose)
    assert server.requests[0].body["max_tokens"] == LIMITS[purpose].max_tokens
    assert server.requests[0].body["stream"] is True


def test_a_choice_asks_for_far_less_than_a_file() -> None:
    assert LIMITS["local"].max_tokens * 10 <= LIMITS["generate"].max_tokens


@pytest.mark.parametrize("kind", KIND)
def test_the_token_budget_clips_then_refuses_without_a_request(
    kind: str, server: ScriptedAPIServer
) -> None:
    budget = RunBudget(max_tokens=200)
    server.script(Reply(input_tokens=120, output_tokens=60))
    llm = sdk_provider(kind, server, budget=budget)
    llm.complete("s", "prompt", purpose="generate")
    assert server.requests[0].body["max_tokens"] == 200 - count_tokens("sprompt")
    assert budget.tokens == 180
    with pytest.raises(BudgetExhausted, match=r"180 of 200 tokens used.*--budget-tokens"):
        llm.complete("s", "a prompt longer than the twenty tokens left " * 5, purpose="generate")
    assert len(server.requests) == 1


def test_the_cost_budget_refuses_once_spent(server: ScriptedAPIServer, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."m"]\ninput = 1000.0\noutput = 1000.0\n')
    budget = RunBudget(max_usd=0.01)
    server.script(Reply(input_tokens=10, output_tokens=5))
    env = {"HTAM_PRICES": str(prices), "HTAM_LLM_MODEL": "m"}
    llm = sdk_provider("openai", server, budget=budget, env=env)
    llm.complete("s", "p")
    assert budget.usd == pytest.approx(15 * 1000 / 1e6)
    with pytest.raises(BudgetExhausted, match=r"\$0\.0150 of \$0\.0100 \(--budget-usd\)"):
        llm.complete("s", "p2", purpose="local")
    assert len(server.requests) == 1
    assert budget.to_json()["usd"] == budget.usd


def test_cached_answers_spend_no_budget(server: ScriptedAPIServer) -> None:
    budget = RunBudget(max_tokens=1000)
    server.script(Reply(input_tokens=100, output_tokens=100))
    sdk_provider("openai", server, cache=True, budget=budget).complete("s", "same")
    sdk_provider("openai", server, cache=True, budget=budget).complete("s", "same")
    assert len(server.requests) == 1 and budget.tokens == 200


@pytest.mark.parametrize(("tokens", "usd"), [(0, None), (-5, None), (None, 0.0), (None, -1.0)])
def test_a_budget_must_be_positive(tokens: int | None, usd: float | None) -> None:
    with pytest.raises(LLMError, match="must be positive"):
        RunBudget(max_tokens=tokens, max_usd=usd)


STUCK = {
    "slow": Reply(text="x" * 4000, piece_delay_s=0.02),  # generating, never finishing
    "stall": Reply(text="x" * 400, stall_after=4),  # alive (SSE comments), no more data
    "silent": Reply(text="x" * 400, stall_after=4, stall_silent=True),  # not a byte more
}


@pytest.mark.parametrize("kind", KIND)
@pytest.mark.parametrize("mode", sorted(STUCK))
def test_a_stuck_generation_is_abandoned_at_its_deadline(
    kind: str, mode: str, server: ScriptedAPIServer
) -> None:
    server.script(STUCK[mode], Reply(text="never asked for"))
    llm = sdk_provider(kind, server, retry=quick())
    started = time.monotonic()
    with pytest.raises(LLMError, match="still generating at its deadline of 0.5s; abandoned"):
        llm.complete("s", "p", purpose="generate")
    elapsed = time.monotonic() - started
    assert DEADLINE_S <= elapsed < DEADLINE_S + MARGIN_S
    assert len(server.requests) == 1, "a generation that ran out is not retried"
    if mode != "silent":  # the server notices the hang-up at its next write
        deadline = time.monotonic() + MARGIN_S
        while not server.hangups and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.hangups == 1


BEFORE_TEXT = {"openai": 0, "anthropic": 2}  # events before the first piece of text


@pytest.mark.parametrize("kind", KIND)
def test_a_server_that_generates_nothing_is_retried(kind: str, server: ScriptedAPIServer) -> None:
    stalled = Reply(stall_after=BEFORE_TEXT[kind], stall_silent=True)
    server.script(stalled, stalled)
    llm = sdk_provider(kind, server, retry=quick(attempts=2))
    started = time.monotonic()
    with pytest.raises(LLMError, match="gave up after 2 attempts"):
        llm.complete("s", "p", purpose="local")
    assert time.monotonic() - started < 2 * DEADLINE_S + MARGIN_S
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KIND)
@pytest.mark.parametrize(
    ("status", "retried"),
    [(400, False), (401, False), (403, False), (404, False), (422, False)]
    + [(408, True), (429, True), (500, True), (502, True), (503, True), (529, True)],
)
def test_only_retryable_statuses_are_retried(
    kind: str, status: int, retried: bool, server: ScriptedAPIServer
) -> None:
    server.script(Reply(status=status), Reply(text="second try"))
    llm = sdk_provider(kind, server, retry=quick(attempts=2))
    if retried:
        assert llm.complete("s", "p").text == "second try"
    else:
        with pytest.raises(LLMError, match=f"HTTP {status}"):
            llm.complete("s", "p")
    assert len(server.requests) == (2 if retried else 1)


@pytest.mark.parametrize("kind", KIND)
def test_an_answer_cut_off_at_max_tokens_says_so(kind: str, server: ScriptedAPIServer) -> None:
    server.script(Reply(text="```python\nclass ModelNew(", finish="length"))
    assert sdk_provider(kind, server).complete("s", "p").truncated is True


def test_a_local_server_counts_tokens_and_costs_nothing(server: ScriptedAPIServer) -> None:
    server.script(Reply(input_tokens=300, output_tokens=40))
    llm = sdk_provider("openai", server, env={"HTAM_LLM_MODEL": "smollm2-135m"})
    completion = llm.complete("s", "p", purpose="local")
    assert completion.pricing == "local" and completion.cost_usd == 0.0
    assert llm.usage.line() == "LLM: 1 calls, 300 in / 40 out tokens, $0 (local server)"
    assert llm.usage.to_json()["cost_note"] == "local"


def test_tokens_are_counted_here_when_the_server_sends_no_usage(
    server: ScriptedAPIServer,
) -> None:
    server.script(Reply(text="a short answer", usage=False))
    completion = sdk_provider("openai", server).complete("system", "prompt")
    assert completion.output_tokens == count_tokens("a short answer")
    assert completion.input_tokens == count_tokens("systemprompt")


def test_an_unlisted_remote_model_has_an_unknown_cost() -> None:
    remote = OpenAIProvider(
        "some-new-model",
        api_key="sk-test-0123456789abcdef",
        base_url="https://llm.example.com/v1",
        prices=load_prices({}),
        cache=None,
    )
    assert remote.pricing == "unknown"
    usage = Usage()
    usage.add(Completion("t", 10, 5, 0.0, False, 0.1, pricing="unknown"), "generate")
    assert usage.line().endswith("cost: unknown (no listed price; see HTAM_PRICES)")


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://192.168.1.20:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("https://api.deepseek.com/v1", False),
        ("http://8.8.8.8/v1", False),
        (None, False),
    ],
)
def test_local_urls(url: str | None, local: bool) -> None:
    assert is_local_url(url) is local


def test_the_cache_key_includes_the_base_url_and_the_model() -> None:
    with ScriptedAPIServer() as first, ScriptedAPIServer() as second:
        sdk_provider("openai", first, cache=True).complete("s", "same prompt")
        sdk_provider("openai", second, cache=True).complete("s", "same prompt")
        env = {"HTAM_LLM_MODEL": "other-model"}
        sdk_provider("openai", second, cache=True, env=env).complete("s", "same prompt")
        again = sdk_provider("openai", second, cache=True).complete("s", "same prompt")
        assert (len(first.requests), len(second.requests)) == (1, 2)
        assert again.cached


def test_one_steps_usage_is_the_difference() -> None:
    usage = Usage()
    usage.add(Completion("a", 10, 5, 0.5, False, 0.1), "local")
    before = usage.copy()
    usage.add(Completion("b", 100, 50, 1.0, False, 0.1), "generate")
    step = usage.since(before)
    assert (step.calls, step.input_tokens, step.output_tokens) == (1, 100, 50)
    assert step.cost_usd == pytest.approx(1.0)
    assert step.by_purpose == {"local": 0.0, "generate": 1.0}


def test_a_server_that_refuses_stream_options_is_asked_without(server: ScriptedAPIServer) -> None:
    refusal = "1 validation error: stream_options: extra fields not permitted"
    server.script(Reply(status=422, message=refusal), Reply(text="fine"), Reply(text="again"))
    llm = sdk_provider("openai", server)
    assert llm.complete("system", "p").text == "fine"
    assert llm.complete("system", "p2").text == "again"
    assert ["stream_options" in r.body for r in server.requests] == [True, False, False]
    assert llm.usage.output_tokens == count_tokens("fine") + count_tokens("again")


@pytest.mark.parametrize(
    ("model", "reasoning"),
    [
        ("deepseek-reasoner", True),
        ("deepseek-r1", True),
        ("DeepSeek-R1-Distill-Qwen-7B", True),
        ("o1", True),
        ("o3-mini", True),
        ("openai/o4-mini", True),
        ("gpt-5", True),
        ("qwq-32b", True),
        ("gpt-4o", False),
        ("gpt-4o-mini", False),
        ("claude-sonnet-4-6", False),
        ("smollm2-135m", False),
        ("llama-3.1-8b-instruct", False),
        ("mistral-large-2411", False),
    ],
)
def test_reasoning_models_are_told_by_name(model: str, reasoning: bool) -> None:
    assert is_reasoning_model(model, {}) is reasoning
    assert is_reasoning_model(model, {"HTAM_LLM_REASONING": "1"}) is True
    assert is_reasoning_model(model, {"HTAM_LLM_REASONING": "0"}) is False


@pytest.mark.parametrize("kind", KIND)
def test_a_reasoning_model_gets_room_to_think(kind: str, server: ScriptedAPIServer) -> None:
    llm = sdk_provider(kind, server, env={"HTAM_LLM_MODEL": "deepseek-reasoner"})
    llm.complete("s", "p", purpose="local")
    expected = LIMITS["local"].max_tokens + REASONING_EXTRA.max_tokens
    assert server.requests[0].body["max_tokens"] == expected


def test_max_completion_tokens_where_max_tokens_is_refused(server: ScriptedAPIServer) -> None:
    refusal = (
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead."
    )
    server.script(Reply(status=400, message=refusal), Reply(text="one"), Reply(text="two"))
    llm = sdk_provider("openai", server, env={"HTAM_LLM_MODEL": "o3-mini"})
    assert llm.complete("s", "p", purpose="local").text == "one"
    assert llm.complete("s", "p2", purpose="local").text == "two"
    sent = [
        (r.body.get("max_tokens"), r.body.get("max_completion_tokens")) for r in server.requests
    ]
    limit = LIMITS["local"].max_tokens + REASONING_EXTRA.max_tokens
    assert sent == [(limit, None), (None, limit), (None, limit)]


def test_a_too_large_max_tokens_stays_an_error(server: ScriptedAPIServer) -> None:
    server.script(Reply(status=400, message="max_tokens is too large: 6144 > 4096"))
    with pytest.raises(LLMError, match="HTTP 400.*max_tokens is too large"):
        sdk_provider("openai", server).complete("s", "p", purpose="generate")
    assert len(server.requests) == 1


def test_a_model_stuck_in_its_reasoning_is_abandoned_not_retried(
    server: ScriptedAPIServer,
) -> None:
    server.script(Reply(reasoning="hmm " * 100, text="{}", stall_after=3), Reply())
    llm = sdk_provider("openai", server, retry=quick())
    with pytest.raises(LLMError, match="still generating"):
        llm.complete("s", "p", purpose="local")
    assert len(server.requests) == 1


def test_reasoning_is_not_part_of_the_answer(server: ScriptedAPIServer) -> None:
    server.script(Reply(reasoning="I think omp_simd", text='{"local": "soa_layout"}'))
    assert sdk_provider("openai", server).complete("s", "p").text == '{"local": "soa_layout"}'
