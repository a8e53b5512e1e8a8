"""The provider interface, completions, errors, redaction and run totals."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Shapes of API keys that must never reach a file even if nobody registered them.
_KEY_PATTERNS = (
    re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._\-]{16,}"),
    re.compile(r"(?i)(x-api-key['\"]?\s*[:=]\s*['\"]?)[A-Za-z0-9._\-]{8,}"),
)
REDACTED = "[REDACTED]"

_known_secrets: set[str] = set()


class LLMError(Exception):
    """A provider call failed for good (after retries), or a provider is misconfigured."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def register_secret(secret: str | None) -> None:
    """Remember a key so that `redact` masks it wherever it shows up."""
    if secret and len(secret) >= 4:
        _known_secrets.add(secret)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Mask registered keys, the given `secrets` and anything shaped like an API key."""
    for secret in sorted({*_known_secrets, *secrets}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    for pattern in _KEY_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


@dataclass(frozen=True)
class Completion:
    """One answer. `cost_usd` is 0 for cached answers: nothing was paid for them."""

    text: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cached: bool
    latency_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    """Totals over one run (one provider object)."""

    calls: int = 0
    cached_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    by_purpose: dict[str, float] = field(default_factory=dict)

    def add(self, completion: Completion, purpose: str) -> None:
        self.calls += 1
        self.cached_calls += int(completion.cached)
        self.input_tokens += completion.input_tokens
        self.output_tokens += completion.output_tokens
        self.cost_usd += completion.cost_usd
        key = purpose or "other"
        self.by_purpose[key] = self.by_purpose.get(key, 0.0) + completion.cost_usd

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Provider(ABC):
    """An LLM that answers (system, prompt) with a `Completion`, or raises `LLMError`."""

    name: str
    model: str

    def __init__(self) -> None:
        self.usage = Usage()

    def complete(
        self, system: str, prompt: str, *, max_tokens: int = 4096, purpose: str = ""
    ) -> Completion:
        completion = self._complete(system, prompt, max_tokens=max_tokens, purpose=purpose)
        self.usage.add(completion, purpose)
        return completion

    @abstractmethod
    def _complete(self, system: str, prompt: str, *, max_tokens: int, purpose: str) -> Completion:
        """Produce one completion; `complete` does the run accounting."""
