"""Bounds on LLM calls: tokens and a deadline per purpose, and a budget per run.

A choice needs a few dozen tokens and a kernel file a few thousand: each purpose asks
for what it needs, so a model that runs on does not run for minutes. A run's budget
(`--budget-tokens`, `--budget-usd`) is checked before every call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from htam_engine.llm.errors import LLMError


@dataclass(frozen=True)
class CallLimit:
    """`max_tokens` of output, and `deadline_s` after which a generation is abandoned."""

    max_tokens: int
    deadline_s: float


# "local" is the choice of a local strategy (a JSON object with a one-line reason).
# Code purposes get room for a full file: the prompt shows up to 4,500 tokens of code.
LIMITS = {
    "local": CallLimit(max_tokens=256, deadline_s=60.0),
    "translate": CallLimit(max_tokens=6144, deadline_s=300.0),
    "generate": CallLimit(max_tokens=6144, deadline_s=300.0),
    "repair": CallLimit(max_tokens=6144, deadline_s=300.0),
}
DEFAULT_LIMIT = CallLimit(max_tokens=4096, deadline_s=300.0)
# A reasoning model (DeepSeek-R1, the paper's; o-series; QwQ) spends its chain of thought
# inside max_tokens: each purpose gets this much more room and time on top.
REASONING_EXTRA = CallLimit(max_tokens=8192, deadline_s=300.0)
_REASONING_NAMES = re.compile(r"(?i)(reasoner|(^|[-_/])r1($|[-_/])|(^|/)o[1-9]|gpt-5|qwq|thinking)")
REASONING_ENV = "HTAM_LLM_REASONING"  # "1" or "0": overrides the guess from the name


def is_reasoning_model(model: str, env: Mapping[str, str]) -> bool:
    override = env.get(REASONING_ENV, "").strip()
    if override in {"0", "1"}:
        return override == "1"
    return _REASONING_NAMES.search(model) is not None


def limit_for(purpose: str, reasoning: bool = False) -> CallLimit:
    base = LIMITS.get(purpose, DEFAULT_LIMIT)
    if not reasoning:
        return base
    extra = REASONING_EXTRA
    return CallLimit(base.max_tokens + extra.max_tokens, base.deadline_s + extra.deadline_s)


# A server's measured output speed bounds what a call can finish: a local model that
# writes 20 tokens/s needs 5 minutes for a 6,144-token file. Its deadline grows to fit
# (up to LOCAL_DEADLINE_S: it costs nothing but time); where the deadline cannot grow
# (a paid API, or past that cap) max_tokens shrinks to what fits, never below MIN_TOKENS.
LOCAL_DEADLINE_S = 1800.0
SPEED_MARGIN = 1.25
MIN_TOKENS = 256


def adapt(limit: CallLimit, tokens_per_s: float | None, local: bool) -> CallLimit:
    """`limit` fitted to a server that writes `tokens_per_s` (None: not measured yet)."""
    if not tokens_per_s or tokens_per_s <= 0:
        return limit
    needed = SPEED_MARGIN * limit.max_tokens / tokens_per_s
    deadline = min(max(limit.deadline_s, needed), LOCAL_DEADLINE_S) if local else limit.deadline_s
    fits = int(tokens_per_s * deadline / SPEED_MARGIN)
    return CallLimit(max(min(limit.max_tokens, fits), min(MIN_TOKENS, limit.max_tokens)), deadline)


class BudgetExhausted(LLMError):
    """The run's token or cost budget does not allow another call."""


@dataclass
class RunBudget:
    """Tokens (input + output) and dollars one run may spend; None = no limit.

    Thread-safe: best-of-k generations charge one budget from several threads.
    """

    max_tokens: int | None = None
    max_usd: float | None = None
    tokens: int = 0
    usd: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise LLMError(f"--budget-tokens must be positive, not {self.max_tokens}")
        if self.max_usd is not None and self.max_usd <= 0:
            raise LLMError(f"--budget-usd must be positive, not {self.max_usd}")

    def allow(self, purpose: str, prompt_tokens: int, max_tokens: int) -> int:
        """The output tokens this call may ask for; `BudgetExhausted` if it may not run."""
        with self._lock:
            if self.max_usd is not None and self.usd >= self.max_usd:
                raise BudgetExhausted(
                    f"LLM budget spent: ${self.usd:.4f} of ${self.max_usd:.4f} "
                    f"(--budget-usd); no {purpose or 'LLM'} call made"
                )
            if self.max_tokens is None:
                return max_tokens
            left = self.max_tokens - self.tokens - prompt_tokens
            if left <= 0:
                raise BudgetExhausted(
                    f"LLM budget spent: {self.tokens} of {self.max_tokens} tokens used and "
                    f"this {purpose or 'LLM'} prompt needs {prompt_tokens} (--budget-tokens)"
                )
            return min(max_tokens, left)

    def charge(self, tokens: int, usd: float) -> None:
        with self._lock:
            self.tokens += tokens
            self.usd += usd

    def to_json(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "max_usd": self.max_usd,
            "tokens": self.tokens,
            "usd": self.usd,
        }
