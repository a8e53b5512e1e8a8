"""`make_provider`: pick a provider from arguments and the environment, and say why."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from htam_engine.llm.base import LLMError, Provider
from htam_engine.llm.cache import ResponseCache
from htam_engine.llm.choice import DEFAULT_MODELS, PROVIDERS, choose_provider, show_url
from htam_engine.llm.limits import RunBudget, is_reasoning_model
from htam_engine.llm.prices import load_prices
from htam_engine.llm.replay import Recorder, ReplayProvider

if TYPE_CHECKING:  # the SDKs take seconds to import: only a remote provider needs them
    from htam_engine.llm.remote import RetryPolicy

# Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) accept any key; the SDK needs one.
NO_KEY = "no-key"


def _remote(
    name: str,
    model: str,
    base_url: str | None,
    env: Mapping[str, str],
    cache: bool,
    retry: RetryPolicy | None,
) -> Provider:
    from htam_engine.llm.remote import AnthropicProvider, OpenAIProvider

    prices = load_prices(env)
    store = ResponseCache() if cache else None
    if name == "anthropic":
        key = env.get("ANTHROPIC_API_KEY")
        if not key:
            raise LLMError("provider anthropic needs ANTHROPIC_API_KEY in the environment")
        return AnthropicProvider(
            model, api_key=key, base_url=base_url, prices=prices, cache=store, retry=retry
        )
    key = env.get("OPENAI_API_KEY") or ""
    if not key and not base_url:
        raise LLMError(
            "provider openai needs OPENAI_API_KEY, or a base URL (--base-url or "
            "HTAM_LLM_BASE_URL) of an OpenAI-compatible server"
        )
    return OpenAIProvider(
        model, api_key=key or NO_KEY, base_url=base_url, prices=prices, cache=store, retry=retry
    )


def make_provider(
    name: str = "auto",
    *,
    model: str | None = None,
    base_url: str | None = None,
    cassette: str | Path | None = None,
    record: str | Path | None = None,
    env: Mapping[str, str] = os.environ,
    cache: bool = True,
    retry: RetryPolicy | None = None,
    budget: RunBudget | None = None,
) -> tuple[Provider | None, str]:
    """The provider (None = offline) and one line saying which one and why.

    `budget` (from `--budget-tokens` / `--budget-usd`) bounds every call it makes.
    Raises `LLMError` for an unknown name or a provider that lacks what it needs.
    """
    if name not in PROVIDERS:
        raise LLMError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    cassette_path = Path(cassette) if cassette else None
    why = f"--provider {name}"
    if name == "auto":
        name, why = choose_provider(base_url, cassette_path, env)
    if name == "offline":
        return None, f"offline: mechanical strategies only ({why})"
    provider: Provider
    if name == "replay":
        cassette_path = cassette_path or (
            Path(env["HTAM_CASSETTE"]) if env.get("HTAM_CASSETTE") else None
        )
        if cassette_path is None:
            raise LLMError("provider replay needs a cassette (--cassette or HTAM_CASSETTE)")
        provider = ReplayProvider(cassette_path)
        line = f"replay from {cassette_path} ({why})"
    else:
        base_url = base_url or (env.get("HTAM_LLM_BASE_URL") if name == "openai" else None)
        chosen = model or env.get("HTAM_LLM_MODEL") or DEFAULT_MODELS[name]
        provider = _remote(name, chosen, base_url, env, cache, retry)
        where = f" at {show_url(base_url)}" if base_url else ""
        line = f"{name} {chosen}{where} ({why})"
    provider.reasoning = is_reasoning_model(provider.model, env)
    if provider.reasoning:
        line += "; a reasoning model (more tokens per call)"
    if record:
        provider = Recorder(provider, Path(record))
        line += f"; recording to {record}"
    provider.budget = budget
    return provider, line
