"""LLM errors and redaction of secrets (no SDK imports)."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Shapes of API keys that must never reach a file even if nobody registered them.
_KEY_PATTERNS = (
    re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._\-]{16,}"),
    re.compile(r"(?i)(x-api-key['\"]?\s*[:=]\s*['\"]?)[A-Za-z0-9._\-]{8,}"),
)
REDACTED = "[REDACTED]"
# A registered key shorter than this is a placeholder for a local server ("none", "bridge"):
# masking it would mask that word in every recorded prompt ("allowed ops: none").
MIN_SECRET_CHARS = 8

_known_secrets: set[str] = set()


class LLMError(Exception):
    """A provider call failed for good (after retries), or a provider is misconfigured."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


def register_secret(secret: str | None) -> None:
    """Remember a key so that `redact` masks it wherever it shows up."""
    if secret and len(secret) >= MIN_SECRET_CHARS:
        _known_secrets.add(secret)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Mask registered keys, the given `secrets` and anything shaped like an API key."""
    for secret in sorted({*_known_secrets, *secrets}, key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    for pattern in _KEY_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text
