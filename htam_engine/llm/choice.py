"""Which provider `--provider auto` picks, and why: no SDK imports (the server uses it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from htam_engine.vocabulary import PROVIDERS as PROVIDERS

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o-mini"}


def show_url(url: str) -> str:
    """A base URL without any user:password part, for the reason line."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def choose_provider(
    base_url: str | None, cassette: Path | None, env: Mapping[str, str]
) -> tuple[str, str]:
    """(provider name, why) for `--provider auto`: reads the environment only, so the
    language server can say which provider a step would use without loading any SDK."""
    if cassette is not None:
        return "replay", "a cassette was given"
    if base_url:
        return "openai", "a base URL was given"
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic", "ANTHROPIC_API_KEY is set"
    if env.get("OPENAI_API_KEY"):
        return "openai", "OPENAI_API_KEY is set"
    if env.get("HTAM_LLM_BASE_URL"):
        return "openai", "HTAM_LLM_BASE_URL is set"
    if env.get("HTAM_CASSETTE"):
        return "replay", "HTAM_CASSETTE is set"
    return "offline", "no API key or base URL in the environment"
