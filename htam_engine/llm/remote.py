"""Providers that call an API through the official SDKs: Anthropic and OpenAI(-compatible).

Every call streams, under a deadline: a generation still running at its deadline is
abandoned by closing its HTTP connection (a server that stopped sending is cut off by
the same watchdog), so nothing queues behind it. The SDKs' own retries are off
(`max_retries=0`): `call_with_retries` retries here, only what can succeed on a retry
(429, 5xx, timeouts, connection errors), with every retry logged and the backoff
(exponential, jittered, honouring Retry-After) testable.

A JSON answer (`schema`) uses the most constrained form the server accepts: Anthropic
tool use; OpenAI `json_schema`, then `json_grammar` (llama.cpp's `json_object` with a
`schema`, which its server compiles to a grammar: the enum of runnable ids is enforced
token by token), then plain `json_object`, then JSON asked for in the prompt. A form the
server rejects (HTTP 400/422/500/501) costs that one request: the provider instance drops
it for the rest of the run (`forms`), so later calls start at the form that worked.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import logging
import random
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anthropic
import openai

from htam_engine.llm import learned
from htam_engine.llm.base import (
    Completion,
    JsonSchema,
    LLMError,
    LLMRequest,
    Provider,
    redact,
    register_secret,
)
from htam_engine.llm.cache import ResponseCache, prompt_key
from htam_engine.llm.limits import CallLimit, adapt, limit_for
from htam_engine.llm.prices import PriceTable
from htam_engine.llm.structured import bounded_strings
from htam_engine.llm.tokens import count_tokens

log = logging.getLogger("htam.llm")

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# Statuses with which servers refuse a response_format or tools they do not support
# (llama.cpp answers json_schema with 500; vLLM with 400 or 422).
FORM_REJECTED_STATUS = frozenset({400, 422, 500, 501})
T = TypeVar("T")
# The longest free string (a choice's "reason") a grammar-constrained answer may write:
# one line, well inside the choice's max_tokens.
GRAMMAR_STRING_CHARS = 240


@dataclass
class RetryPolicy:
    """`attempts` calls at most; delay `base_s * 2**n` plus up to `base_s` of jitter,
    or the server's Retry-After when it gives one, capped at `max_delay_s`.
    `timeout_s` (when set) caps every purpose's deadline (`limits.LIMITS`)."""

    attempts: int = 4
    base_s: float = 1.0
    max_delay_s: float = 60.0
    timeout_s: float | None = None
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, retry_index: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay_s)
        backoff = self.base_s * 2**retry_index + self.rng.uniform(0, self.base_s)
        return min(backoff, self.max_delay_s)

    def deadline_s(self, purpose: str, reasoning: bool = False, deadline: float = 0.0) -> float:
        """The purpose's deadline (or `deadline`, an adapted one), capped by `timeout_s`."""
        deadline = deadline or limit_for(purpose, reasoning).deadline_s
        return deadline if self.timeout_s is None else min(deadline, self.timeout_s)


class MalformedResponse(ValueError):
    """A response that is valid JSON but not the API's shape."""


class DeadlineExceeded(Exception):
    """The watchdog closed a stream at its deadline (not an SDK error: never retried
    blindly, see `_classify`)."""

    def __init__(self, deadline_s: float, generated: int) -> None:
        super().__init__(f"deadline of {deadline_s:g}s")
        self.deadline_s = deadline_s
        self.generated = generated


class StreamBroken(Exception):
    """The connection failed in the middle of a streamed answer: retried."""


class FormRejected(Exception):
    """The server refused a structured-output form: try the next one."""


@dataclass(frozen=True)
class Answer:
    text: str
    input_tokens: int
    output_tokens: int
    truncated: bool = False


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
_SDK_ERRORS = (
    anthropic.AnthropicError,
    openai.OpenAIError,
    ValueError,
    DeadlineExceeded,
    StreamBroken,
)


def _classify(error: Exception) -> tuple[bool, float | None, str]:
    """(retryable, retry-after seconds, one-line description) for an SDK error.

    A stream the watchdog closed is retried only if the model had generated nothing
    (the server stalled); a generation still running at its deadline would only run
    out again."""
    if isinstance(error, DeadlineExceeded):
        if error.generated:
            return False, None, f"still generating at its {error}; abandoned"
        return True, None, f"timed out (nothing generated within the {error})"
    if isinstance(error, anthropic.APITimeoutError | openai.APITimeoutError):
        return True, None, "timed out"
    if isinstance(error, (*_TRANSIENT, StreamBroken)):
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
        except _SDK_ERRORS as error:
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


class _Watch:
    """What one streamed call received so far (events; pieces of generated text or
    reasoning), and whether its deadline closed it."""

    def __init__(self) -> None:
        self.fired = False
        self.events = 0
        self.generated = 0


def within_deadline(
    stream: Any, started: float, seconds: float, read: Callable[[_Watch], Answer]
) -> Answer:
    """`read(stream)`, but close the stream (its HTTP connection) from a timer thread
    once `seconds` have passed since `started`, so that a read blocked on a silent
    server returns and a server still generating sees the client hang up."""
    watch = _Watch()

    def fire() -> None:
        watch.fired = True
        stream.close()

    timer = threading.Timer(max(started + seconds - time.monotonic(), 0.0), fire)
    timer.daemon = True
    timer.start()
    try:
        answer = read(watch)
    except Exception as error:  # noqa: BLE001 - a closed socket raises what its layer raises
        if watch.fired:
            pass  # our own close: reported as the deadline below
        elif isinstance(error, _SDK_ERRORS):
            raise
        else:  # a transport error the SDK let through mid-stream (anthropic does)
            raise StreamBroken(f"{type(error).__name__}: {error}") from error
    finally:
        timer.cancel()
        stream.close()
    if watch.fired:
        raise DeadlineExceeded(seconds, watch.generated)
    return answer


def is_local_url(base_url: str | None) -> bool:
    """A server on this machine or a private network: its calls cost nothing."""
    host = urlsplit(base_url).hostname if base_url else None
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


class RemoteProvider(Provider):
    """Cache lookup -> API call(s) with retries and form fallback -> cost -> cache store."""

    FORMS: tuple[str, ...] = ("prompted",)

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
        self.server = learned.server_key(self.name, base_url, model)
        # shrinks as the server rejects forms; starts without those it refused before
        self.forms = learned.known_forms(self.server, self.FORMS)
        self._forms_lock = threading.Lock()  # best-of-k samples share it
        self.pricing = self._pricing()
        if self.pricing == "unknown":
            log.warning("no price listed for %s; its cost is unknown (see HTAM_PRICES)", model)

    def _pricing(self) -> str:
        if self.prices.price(self.model) is not None:
            return "listed"
        return "local" if is_local_url(self.base_url) else "unknown"

    def cache_key(self, request: LLMRequest) -> str:
        """Provider, base URL and model, the system prompt, prompt and schema, and which
        sample it is (not the limit: an answer is reused whatever room the call had)."""
        schema, where = request.schema, self.base_url or ""
        shape = json.dumps(schema.schema, sort_keys=True) if schema else ""
        parts = (request.system, request.prompt, shape, str(request.sample))
        return prompt_key(self.name, where, self.model, *parts)

    def _complete(self, request: LLMRequest) -> Completion:
        started = time.perf_counter()
        key = self.cache_key(request)
        hit = self.cache.get(key) if self.cache else None
        if hit is not None:
            return Completion(**{**hit, "cost_usd": 0.0, "cached": True, "latency_s": 0.0})
        purpose = request.purpose
        what = f"{self.name} {self.model}" + (f" ({purpose})" if purpose else "")
        limit = self._fitted(request)
        request = replace(request, max_tokens=limit.max_tokens)
        form, answer = self._answer(request, what, limit.deadline_s)
        cost = self.prices.cost(self.model, answer.input_tokens, answer.output_tokens)
        completion = Completion(
            answer.text,
            answer.input_tokens,
            answer.output_tokens,
            cost,
            False,
            time.perf_counter() - started,
            form=form,
            truncated=answer.truncated,
            pricing=self.pricing,
        )
        if self.cache:
            self.cache.put(key, completion.to_json())
        learned.record_speed(self.server, answer.output_tokens, completion.latency_s)
        log.info(
            "%s: %d in / %d out tokens%s, %s, %.2fs, form %s",
            what,
            answer.input_tokens,
            answer.output_tokens,
            " (cut off at max_tokens)" if answer.truncated else "",
            f"${cost:.5f}" if self.pricing == "listed" else self.pricing,
            completion.latency_s,
            form,
        )
        return completion

    def _fitted(self, request: LLMRequest) -> CallLimit:
        """The request's max_tokens and its purpose's deadline, fitted to this server's
        measured speed (`limits.adapt`)."""
        base = CallLimit(request.max_tokens, limit_for(request.purpose, self.reasoning).deadline_s)
        fitted = adapt(base, learned.tokens_per_s(self.server), is_local_url(self.base_url))
        if fitted != base:
            log.info(
                "%s %s: %d tokens within %.0fs at the measured %.1f tokens/s",
                self.model, request.purpose, fitted.max_tokens, fitted.deadline_s,
                learned.tokens_per_s(self.server) or 0.0,
            )  # fmt: skip
        return fitted

    def _answer(self, request: LLMRequest, what: str, deadline: float) -> tuple[str, Answer]:
        """(form used, answer): free text, or the first structured form not refused."""
        deadline_s = self.retry.deadline_s(request.purpose, self.reasoning, deadline)
        if request.schema is None:

            def text() -> Answer:
                return self._call(request, deadline_s, "text")

            return "text", call_with_retries(text, self.retry, what)
        while True:
            with self._forms_lock:
                form, last = self.forms[0], len(self.forms) == 1

            def call(form: str = form, last: bool = last) -> Answer:
                return self._structured(request, deadline_s, form, last)

            try:
                return form, call_with_retries(call, self.retry, what)
            except FormRejected as rejected:
                self._drop(form, f"{what}: {form} refused ({rejected})")

    def _drop(self, form: str, why: str) -> None:
        """Stop using `form` (once, however many samples saw it refused)."""
        with self._forms_lock:
            if self.forms[0] == form and len(self.forms) > 1:
                self.forms.pop(0)
                log.warning("%s; next %s", why, self.forms[0])
                learned.refuse_form(self.server, form)  # the next run starts past it

    def _structured(self, request: LLMRequest, deadline_s: float, form: str, last: bool) -> Answer:
        try:
            return self._call(request, deadline_s, form)
        except _STATUS as error:
            if last or error.status_code not in FORM_REJECTED_STATUS:
                raise
            raise FormRejected(f"HTTP {error.status_code}") from None

    @abstractmethod
    def _call(self, request: LLMRequest, deadline_s: float, form: str) -> Answer:
        """One streamed API request in `form` (`text`, or one of `FORMS` for a request
        with a schema), no retries."""


def _prompted(system: str, schema: JsonSchema) -> str:
    """The system prompt with the schema spelled out (the loosest JSON form)."""
    return f"{system}\nThe JSON object must match this JSON schema: {json.dumps(schema.schema)}"


class AnthropicProvider(RemoteProvider):
    """Claude through the Messages API; JSON answers through a forced tool call."""

    name = "anthropic"
    FORMS = ("tool", "prompted")

    def __init__(self, model: str, *, api_key: str, base_url: str | None = None, **kw: Any):
        super().__init__(model, api_key=api_key, base_url=base_url, **kw)
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0)

    def _call(self, request: LLMRequest, deadline_s: float, form: str) -> Answer:
        schema = request.schema
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": [{"role": "user", "content": request.prompt}],
        }
        if schema is not None and form == "tool":
            tool = {
                "name": schema.name,
                "description": schema.description,
                "input_schema": schema.schema,
            }
            body.update(tools=[tool], tool_choice={"type": "tool", "name": schema.name})
        elif schema is not None:
            body["system"] = _prompted(request.system, schema)
        started = time.monotonic()
        stream = self._client.messages.create(**body, stream=True, timeout=deadline_s)
        return within_deadline(stream, started, deadline_s, lambda w: _read_anthropic(stream, w))


def _read_anthropic(stream: Any, watch: _Watch) -> Answer:
    parts: list[str] = []
    input_tokens = output_tokens = 0
    stop_reason = None
    try:
        for event in stream:
            watch.events += 1
            if event.type == "message_start":
                input_tokens = int(event.message.usage.input_tokens)
            elif event.type == "content_block_delta":
                delta = event.delta
                watch.generated += 1  # text, tool input or thinking: the model is working
                if delta.type in {"text_delta", "input_json_delta"}:
                    parts.append(delta.text if delta.type == "text_delta" else delta.partial_json)
            elif event.type == "message_delta":
                output_tokens = int(event.usage.output_tokens)
                stop_reason = event.delta.stop_reason
    except (AttributeError, TypeError, ValueError) as error:
        if isinstance(error, json.JSONDecodeError):
            raise
        raise MalformedResponse(f"unexpected Messages API stream ({error})") from None
    if not watch.events:
        raise MalformedResponse("unexpected Messages API response (an empty stream)")
    return Answer("".join(parts), input_tokens, output_tokens, stop_reason == "max_tokens")


class OpenAIProvider(RemoteProvider):
    """OpenAI chat completions, or any compatible server (vLLM, Ollama, llama.cpp, DeepSeek)."""

    name = "openai"
    # json_grammar: llama-cpp-python's server takes {"type": "json_object", "schema": ...}
    # (llama_chat_format._grammar_for_response_format) and answers json_schema with 500.
    FORMS = ("json_schema", "json_grammar", "json_object", "prompted")

    def __init__(self, model: str, *, api_key: str, base_url: str | None = None, **kw: Any):
        super().__init__(model, api_key=api_key, base_url=base_url, **kw)
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0)
        self.refused: set[str] = set()  # request parameters this server refused

    def _call(self, request: LLMRequest, deadline_s: float, form: str) -> Answer:
        schema, system = request.schema, request.system
        body: dict[str, Any] = {"model": self.model, "max_tokens": request.max_tokens}
        if schema is not None and form == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema.name, "schema": schema.schema, "strict": True},
            }
        elif schema is not None and form == "json_grammar":
            # Free strings get a length bound: a grammar lets a small model ramble in
            # "reason" up to max_tokens, and an object cut off there parses as nothing.
            grammar = bounded_strings(schema.schema, GRAMMAR_STRING_CHARS)
            body["response_format"] = {"type": "json_object", "schema": grammar}
        elif schema is not None and form == "json_object":
            body["response_format"] = {"type": "json_object"}
        if schema is not None and form != "json_schema":
            system = _prompted(system, schema)
        body["messages"] = [
            {"role": "system", "content": system},
            {"role": "user", "content": request.prompt},
        ]
        started = time.monotonic()
        stream = self._open(body, deadline_s)
        sent = system + request.prompt
        return within_deadline(stream, started, deadline_s, lambda w: _read_openai(stream, w, sent))

    def _open(self, request: dict[str, Any], deadline_s: float) -> Any:
        """The stream, asked for with what this server accepts: a parameter it refuses
        (HTTP 400/422 naming it) is adapted from then on (`_adapt`)."""
        while True:
            sent = self._adapt(request)
            try:
                return self._client.chat.completions.create(**sent, stream=True, timeout=deadline_s)
            except openai.APIStatusError as error:
                refused = _refused_parameter(error, sent)
                if refused is None:
                    raise
                log.warning("%s refused %s (HTTP %d)", self.model, refused, error.status_code)
                self.refused.add(refused)

    def _adapt(self, request: dict[str, Any]) -> dict[str, Any]:
        """Ask for the usage chunk unless refused (then tokens are counted here), and
        use `max_completion_tokens` where `max_tokens` was refused (o-series models)."""
        sent = dict(request)
        if "stream_options" not in self.refused:
            sent["stream_options"] = {"include_usage": True}
        if "max_tokens" in self.refused:
            sent["max_completion_tokens"] = sent.pop("max_tokens")
        return sent


def _refused_parameter(error: openai.APIStatusError, sent: Mapping[str, Any]) -> str | None:
    """The request parameter a 400/422 says is unsupported, if it is one we can adapt.
    `max_tokens` only when the server names its replacement (a too-large max_tokens
    must stay an error, never become an unbounded call)."""
    message = str(error)
    if error.status_code not in {400, 422}:
        return None
    if "stream_options" in sent and "stream_options" in message:
        return "stream_options"
    if "max_tokens" in sent and "max_tokens" in message and "max_completion_tokens" in message:
        return "max_tokens"
    return None


def _read_openai(stream: Any, watch: _Watch, sent: str) -> Answer:
    """The streamed answer; tokens from the server's usage chunk, else counted here."""
    parts: list[str] = []
    usage = None
    finish = None
    try:
        for chunk in stream:
            watch.events += 1
            usage = chunk.usage or usage
            if chunk.choices:
                delta = chunk.choices[0].delta
                parts.append(delta.content or "")
                # DeepSeek-R1 and vLLM stream the chain of thought as reasoning_content
                watch.generated += bool(delta.content or getattr(delta, "reasoning_content", None))
                finish = chunk.choices[0].finish_reason or finish
    except (AttributeError, IndexError, TypeError, ValueError) as error:
        if isinstance(error, json.JSONDecodeError):
            raise
        raise MalformedResponse(f"unexpected chat completions stream ({error})") from None
    if not watch.events:
        raise MalformedResponse("unexpected chat completions response (an empty stream)")
    text = "".join(parts)
    if usage is None:  # some local servers send no usage
        return Answer(text, count_tokens(sent), count_tokens(text), finish == "length")
    return Answer(text, int(usage.prompt_tokens), int(usage.completion_tokens), finish == "length")
