"""The provider interface, completions, run totals (and, re-exported, errors and redaction)."""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from htam_engine.llm.errors import REDACTED, LLMError, redact, register_secret
from htam_engine.llm.limits import RunBudget, limit_for
from htam_engine.llm.tokens import count_tokens

__all__ = [
    "REDACTED",
    "Completion",
    "JsonSchema",
    "LLMError",
    "LLMRequest",
    "Provider",
    "Usage",
    "redact",
    "register_secret",
]


@dataclass(frozen=True)
class JsonSchema:
    """The JSON object an answer must be: Anthropic's tool input, OpenAI's json_schema."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class LLMRequest:
    """One call as the providers see it, after `Provider.complete` set its limit.

    `max_tokens` is the purpose's limit (`limits.LIMITS`) or the caller's, cut to what the
    run's budget leaves; `purpose` names the call in logs, budgets and cassettes; `schema`
    asks for a JSON answer; `sample` > 0 is another independent answer to the same prompt.
    """

    system: str
    prompt: str
    max_tokens: int
    purpose: str = ""
    schema: JsonSchema | None = None
    sample: int = 0


@dataclass(frozen=True)
class Completion:
    """One answer. `cost_usd` is 0 for cached answers: nothing was paid for them.

    `form` says how the answer was constrained: `text` (free text), `tool` (Anthropic
    tool use), `json_schema` / `json_grammar` (llama.cpp's json_object with a schema) /
    `json_object` (OpenAI response_format) or `prompted`
    (JSON asked for in the prompt only). `truncated`: the answer hit `max_tokens`.
    """

    text: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cached: bool
    latency_s: float
    form: str = "text"
    truncated: bool = False
    # How the cost is known: "listed" (the price table), "local" (zero, a server on this
    # machine or network) or "unknown" (a remote model with no listed price).
    pricing: str = "listed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    """Totals over one run (one provider object); `pricings` of the calls paid for."""

    calls: int = 0
    cached_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    by_purpose: dict[str, float] = field(default_factory=dict)
    pricings: list[str] = field(default_factory=list)

    def add(self, completion: Completion, purpose: str) -> None:
        self.calls += 1
        self.cached_calls += int(completion.cached)
        self.input_tokens += completion.input_tokens
        self.output_tokens += completion.output_tokens
        self.cost_usd += completion.cost_usd
        key = purpose or "other"
        self.by_purpose[key] = self.by_purpose.get(key, 0.0) + completion.cost_usd
        if not completion.cached and completion.pricing not in self.pricings:
            self.pricings.append(completion.pricing)

    def since(self, before: Usage) -> Usage:
        """What was used after `before` (a `copy()` taken earlier): one step's usage."""
        return Usage(
            calls=self.calls - before.calls,
            cached_calls=self.cached_calls - before.cached_calls,
            input_tokens=self.input_tokens - before.input_tokens,
            output_tokens=self.output_tokens - before.output_tokens,
            cost_usd=self.cost_usd - before.cost_usd,
            by_purpose={
                key: cost - before.by_purpose.get(key, 0.0) for key, cost in self.by_purpose.items()
            },
            pricings=list(self.pricings),  # one provider prices every call the same way
        )

    def copy(self) -> Usage:
        return copy.deepcopy(self)

    def cost_note(self) -> str:
        """`listed`, `local` (counted, free), `unknown`, or `listed+unknown` and the like."""
        return "+".join(self.pricings) if self.pricings else "none"

    def line(self) -> str:
        """One line for reports: calls, tokens and what the cost means."""
        cached = f" ({self.cached_calls} cached)" if self.cached_calls else ""
        tokens = f"{self.input_tokens:,} in / {self.output_tokens:,} out tokens"
        return f"LLM: {self.calls} calls{cached}, {tokens}, {self._cost_text()}"

    def _cost_text(self) -> str:
        if "unknown" in self.pricings:
            known = f"${self.cost_usd:.4f} listed + " if "listed" in self.pricings else ""
            return f"cost: {known}unknown (no listed price; see HTAM_PRICES)"
        if self.pricings == ["local"]:
            return "$0 (local server)"
        note = " (local calls free)" if "local" in self.pricings else ""
        return f"${self.cost_usd:.4f}{note}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cost_note": self.cost_note()}


class Provider(ABC):
    """An LLM that answers (system, prompt) with a `Completion`, or raises `LLMError`.

    `budget` (a `RunBudget`, set by `make_provider`) is checked before every call and
    charged after it; `max_tokens` defaults to the purpose's limit (`limits.LIMITS`).
    """

    name: str
    model: str

    def __init__(self) -> None:
        self.usage = Usage()
        self.budget: RunBudget | None = None
        self.reasoning = False  # a reasoning model: more room per call (limits.limit_for)
        self._usage_lock = threading.Lock()

    def complete(
        self,
        system: str,
        prompt: str,
        *,
        max_tokens: int | None = None,
        purpose: str = "",
        schema: JsonSchema | None = None,
        sample: int = 0,
    ) -> Completion:
        """One answer. With `schema`, the answer's text is JSON in the most constrained
        form the provider supports (`Completion.form`). `sample` > 0 asks for another
        independent answer to the same prompt (best-of-k), never a cached copy of #0."""
        limit = max_tokens or limit_for(purpose, self.reasoning).max_tokens
        return self.send(LLMRequest(system, prompt, limit, purpose, schema, sample))

    def send(self, request: LLMRequest) -> Completion:
        """`complete` for a request whose limit is set: the budget (which may lower the
        limit), the provider's call and the run's usage."""
        if self.budget is not None:
            prompt_tokens = count_tokens(request.system + request.prompt)
            limit = self.budget.allow(request.purpose, prompt_tokens, request.max_tokens)
            request = replace(request, max_tokens=limit)
        completion = self._complete(request)
        if self.budget is not None and not completion.cached:
            tokens = completion.input_tokens + completion.output_tokens
            self.budget.charge(tokens, completion.cost_usd)
        with self._usage_lock:
            self.usage.add(completion, request.purpose)
        return completion

    @abstractmethod
    def _complete(self, request: LLMRequest) -> Completion:
        """Produce one completion; `send` does the limits and the run accounting."""
