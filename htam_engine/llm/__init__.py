"""LLM providers (anthropic, openai-compatible, replay; offline = None), prompts,
structured choices, answer extraction, call limits and budgets, repair and best-of-k,
and token counting.

Names are loaded on first use: the SDKs take seconds to import, and the language server
imports `htam_engine.llm.choice` (which provider would run, and why) without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from htam_engine.llm.base import (
        Completion,
        JsonSchema,
        LLMError,
        LLMRequest,
        Provider,
        Usage,
        redact,
        register_secret,
    )
    from htam_engine.llm.choice import DEFAULT_MODELS, PROVIDERS, choose_provider
    from htam_engine.llm.codegen import (
        Attempt,
        Generated,
        attempt,
        best_of,
        failure_text,
        generate,
        generate_candidates,
        needs_repair,
        repair,
    )
    from htam_engine.llm.extract import CodeAnswer, extract_candidate, extract_code, extract_json
    from htam_engine.llm.factory import make_provider
    from htam_engine.llm.limits import LIMITS, BudgetExhausted, RunBudget, limit_for
    from htam_engine.llm.prices import PriceTable, load_prices
    from htam_engine.llm.prompts import (
        generation_prompt,
        local_selection_prompt,
        repair_prompt,
        translation_prompt,
    )
    from htam_engine.llm.remote import AnthropicProvider, OpenAIProvider, RetryPolicy
    from htam_engine.llm.replay import Recorder, ReplayProvider
    from htam_engine.llm.structured import Choice, choice_schema, parse_choice
    from htam_engine.llm.tokens import count_tokens, tokenizer_name, truncate_tokens

_HOME = {
    "base": [
        "Completion", "JsonSchema", "LLMError", "LLMRequest", "Provider", "Usage", "redact",
        "register_secret",
    ],
    "choice": ["DEFAULT_MODELS", "PROVIDERS", "choose_provider"],
    "codegen": [
        "Attempt", "Generated", "attempt", "best_of", "failure_text", "generate",
        "generate_candidates", "needs_repair", "repair",
    ],
    "extract": ["CodeAnswer", "extract_candidate", "extract_code", "extract_json"],
    "factory": ["make_provider"],
    "limits": ["LIMITS", "BudgetExhausted", "RunBudget", "limit_for"],
    "prices": ["PriceTable", "load_prices"],
    "prompts": [
        "generation_prompt", "local_selection_prompt", "repair_prompt", "translation_prompt",
    ],
    "remote": ["AnthropicProvider", "OpenAIProvider", "RetryPolicy"],
    "replay": ["Recorder", "ReplayProvider"],
    "structured": ["Choice", "choice_schema", "parse_choice"],
    "tokens": ["count_tokens", "tokenizer_name", "truncate_tokens"],
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = [
    "AnthropicProvider",
    "Attempt",
    "attempt",
    "best_of",
    "BudgetExhausted",
    "Choice",
    "choice_schema",
    "choose_provider",
    "CodeAnswer",
    "Completion",
    "count_tokens",
    "DEFAULT_MODELS",
    "extract_candidate",
    "extract_code",
    "extract_json",
    "failure_text",
    "generate",
    "generate_candidates",
    "Generated",
    "generation_prompt",
    "JsonSchema",
    "limit_for",
    "LIMITS",
    "LLMError",
    "LLMRequest",
    "load_prices",
    "local_selection_prompt",
    "make_provider",
    "needs_repair",
    "OpenAIProvider",
    "parse_choice",
    "PriceTable",
    "Provider",
    "PROVIDERS",
    "Recorder",
    "redact",
    "register_secret",
    "repair",
    "repair_prompt",
    "translation_prompt",
    "ReplayProvider",
    "RetryPolicy",
    "RunBudget",
    "tokenizer_name",
    "truncate_tokens",
    "Usage",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
