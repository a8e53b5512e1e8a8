"""The LLM provider a step would use, and why (code actions and htam.status)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer


def provider(ls: HtamServer) -> tuple[str, str]:
    """The provider a step would use: the last job's word, else the settings and the
    server's environment (where editors put API keys), read without loading any SDK."""
    if ls.runs.provider is not None:
        return ls.runs.provider.provider, ls.runs.provider.provider_reason
    settings = ls.settings
    if settings.provider != "auto":
        return settings.provider, f"provider setting is {settings.provider}"
    from htam_engine.llm.choice import choose_provider

    cassette = Path(settings.cassette) if settings.cassette else None
    return choose_provider(settings.base_url, cassette, os.environ)
