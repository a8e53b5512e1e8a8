"""LLM providers (anthropic, openai-compatible, replay; offline = None), prompts,
answer extraction and token counting."""

from htam_engine.llm.base import Completion, LLMError, Provider, Usage, redact, register_secret
from htam_engine.llm.extract import extract_code, extract_json
from htam_engine.llm.factory import DEFAULT_MODELS, PROVIDERS, make_provider
from htam_engine.llm.prices import PriceTable, load_prices
from htam_engine.llm.prompts import generation_prompt, local_selection_prompt
from htam_engine.llm.remote import AnthropicProvider, OpenAIProvider, RetryPolicy
from htam_engine.llm.replay import Recorder, ReplayProvider
from htam_engine.llm.tokens import count_tokens, tokenizer_name, truncate_tokens

__all__ = [
    "DEFAULT_MODELS",
    "PROVIDERS",
    "AnthropicProvider",
    "Completion",
    "LLMError",
    "OpenAIProvider",
    "PriceTable",
    "Provider",
    "Recorder",
    "ReplayProvider",
    "RetryPolicy",
    "Usage",
    "count_tokens",
    "extract_code",
    "extract_json",
    "generation_prompt",
    "load_prices",
    "local_selection_prompt",
    "make_provider",
    "redact",
    "register_secret",
    "tokenizer_name",
    "truncate_tokens",
]
