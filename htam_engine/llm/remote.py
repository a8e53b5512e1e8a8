"""Providers that call an API through the official SDKs: Anthropic and OpenAI(-compatible).

The SDKs' own retries are off (`max_retries=0`): `call_with_retries` retries here, so
that every retry is logged and the backoff (exponential, jittered, honouring
Retry-After) is testable.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anthropic
import openai

from htam_engine.llm.base import Completion, LLMError, Provider, redact, register_secret
from htam_engine.llm.cache import ResponseCache, prompt_key
from htam_engine.llm.prices import PriceTable

log = logging.getLogger("htam.llm")

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
T = TypeVar("T")


@dataclass
class RetryPolicy:
    """`attempts` calls at most; delay `base_s * 2**n` plus up to `base_s` of jitter,
    or the server's Retry-After when it gives one, capped at `max_delay_s`."""

    attempts: int = 4
    base_s: float = 1.0
    max_delay_s: float = 60.0
    timeout_s: float = 180.0
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, retry_index: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        backoff = self.base_s * 2**retry_index + self.rng.uniform(0, self.base_s)
        return min(backoff, self.max_delay_s)


class MalformedResponse(ValueError):
    """A response that is valid JSON but not the API's shape."""


@dataclass(frozen=True)
class Answer:
    text: str
    input_tokens: int
    output_tokens: int


def retry_after_s(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None  # unparsable: fall back to exponential backoff


_TRANSIENT = (
    anthropic.APITimeoutError,
    anthropic.APIConnectionError,
    openai.APITimeoutError,
    openai.APIConnectionError,
)
_STATUS = (anthropic.APIStatusError, openai.APIStatusError)


def _classify(error: Exception) -> tuple[bool, float | None, str]:
    """(retryable, retry-after seconds, one-line description) for an SDK error."""
    if isinstance(error, anthropic.APITimeoutError | openai.APITimeoutError):
        return True, None, "timed out"
    if isinstance(error, _TRANSIENT):
        return True, None, f"connection failed ({error})"
    if isinstance(error, json.JSONDecodeError):
        return False, None, f"the server answered with malformed JSON ({error})"
    if isinstance(error, MalformedResponse):
        return False, None, f"the server answered with {error}"
    if isinstance(error, _STATUS):
        status = error.status_code
        headers = getattr(error.response, "headers", None)
        retryable = status in RETRYABLE_STATUS
        return retryable, retry_after_s(headers) if retryable else None, f"HTTP {status}: {error}"
    return False, None, f"{type(error).__name__}: {error}"


def call_with_retries(call: Callable[[], T], policy: RetryPolicy, what: str) -> T:
    """Run `call`, retrying transient failures; `LLMError` once attempts are spent."""
    for attempt in range(policy.attempts):
        try:
            return call()
        except (anthropic.AnthropicError, openai.OpenAIError, ValueError) as error:
            retryable, retry_after, description = _classify(error)
            if not retryable:
                raise LLMError(f"{what}: {description}") from None
            if attempt == policy.attempts - 1:
                raise LLMError(
                    f"{what}: {description}; gave up after {policy.attempts} attempts"
                ) from None
            delay = policy.delay(attempt, retry_after)
            log.warning(
                "%s",
                redact(f"{what}: {description}; retry {attempt + 1} in {delay:.2f}s"),
            )
            policy.sleep(delay)
    raise LLMError(f"{what}: no attempt was made (attempts={policy.attempts})")


class RemoteProvider(Provider):
    """Cache lookup -> API call with retries -> cost -> cache store."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None,
        prices: PriceTable,
        cache: ResponseCache | None,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__()
        register_secret(api_key)
        self.model = model
        self.base_url = base_url
        self.prices = prices
        self.cache = cache
        self.retry = retry or RetryPolicy()
        if base_url is None and prices.price(model) is None:
            log.warning("no price listed for %s; its calls count as $0 (see HTAM_PRICES)", model)

    def _complete(self, system: str, prompt: str, *, max_tokens: int, purpose: str) -> Completion:
        started = time.perf_counter()
        key = prompt_key(self.name, self.model, system, prompt)
        hit = self.cache.get(key) if self.cache else None
        if hit is not None:
            return Completion(
                hit["text"],
                hit["input_tokens"],
                hit["output_tokens"],
                0.0,
                True,
                time.perf_counter() - started,
            )
        what = f"{self.name} {self.model}" + (f" ({purpose})" if purpose else "")
        answer = call_with_retries(lambda: self._call(system, prompt, max_tokens), self.retry, what)
        cost = self.prices.cost(self.model, answer.input_tokens, answer.output_tokens)
        completion = Completion(
            answer.text,
            answer.input_tokens,
            answer.output_tokens,
            cost,
            False,
            time.perf_counter() - started,
        )
        if self.cache:
            self.cache.put(key, completion.to_json())
        log.info(
            "%s: %d in / %d out tokens, $%.5f, %.2fs",
            what,
            answer.input_tokens,
            answer.output_tokens,
            cost,
            completion.latency_s,
        )
        return completion

    @abstractmethod
    def _call(self, system: str, prompt: str, max_tokens: int) -> Answer:
        """One API request, no retries."""


class AnthropicProvider(RemoteProvider):
    """Claude through the Messages API."""

    name = "anthropic"

    def __init__(self, model: str, *, api_key: str, base_url: str | None = None, **kw: Any):
        super().__init__(model, api_key=api_key, base_url=base_url, **kw)
        self._client = anthropic.Anthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=self.retry.timeout_s
        )

    def _call(self, system: str, prompt: str, max_tokens: int) -> Answer:
        message = self._client.messages.create(
            model=self.model,
            max_tokens=max_tokens,
            system=system,
            messages=[{"role": "user", "content": prompt}],
        )
        try:
            text = "".join(block.text for block in message.content if block.type == "text")
            return Answer(text, int(message.usage.input_tokens), int(message.usage.output_tokens))
        except (AttributeError, TypeError, ValueError) as error:
            raise MalformedResponse(f"unexpected Messages API response ({error})") from None


class OpenAIProvider(RemoteProvider):
    """OpenAI chat completions, or any compatible server (vLLM, Ollama, llama.cpp, DeepSeek)."""

    name = "openai"

    def __init__(self, model: str, *, api_key: str, base_url: str | None = None, **kw: Any):
        super().__init__(model, api_key=api_key, base_url=base_url, **kw)
        self._client = openai.OpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=self.retry.timeout_s
        )

    def _call(self, system: str, prompt: str, max_tokens: int) -> Answer:
        response = self._client.chat.completions.create(
            model=self.model,
            max_tokens=max_tokens,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": prompt},
            ],
        )
        try:
            text = response.choices[0].message.content or ""
            usage = response.usage  # optional on some local servers
            return Answer(
                text,
                int(usage.prompt_tokens) if usage else 0,
                int(usage.completion_tokens) if usage else 0,
            )
        except (AttributeError, IndexError, TypeError, ValueError) as error:
            raise MalformedResponse(f"unexpected chat completions response ({error})") from None
