"""Response cache by prompt hash (diskcache, JSON values, never a key or header)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import diskcache

from htam_engine import paths
from htam_engine.llm.base import redact


def prompt_key(*parts: str) -> str:
    """A stable hash of the parts (provider, model, system, prompt, ...)."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8")).hexdigest()


class ResponseCache:
    """Answers stored under `prompt_key(provider, model, system, prompt)`."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or paths.subdir("llm-cache")
        self._cache = diskcache.Cache(str(self.directory))

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._cache.get(key)
        return json.loads(raw) if isinstance(raw, str) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._cache.set(key, redact(json.dumps(value, ensure_ascii=False)))

    def close(self) -> None:
        self._cache.close()
