"""Injective digests of structured content: the keys of every content-addressed store.

A key built by joining fields with a separator (`"\\0".join(...)`) is not injective:
a field that holds the separator (a sibling header with NUL bytes) makes two different
contents one key, and one folder's verdict or build answers for another's. Here a key is
the hash of a canonical JSON encoding of a structure (strings, numbers, booleans, None,
lists, and mappings with string keys), whose every string is quoted and escaped, so two
different structures never encode alike. Standard library only: the keeper and the
workers import it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any


def _checked(value: Any) -> Any:
    """`value` as plain JSON data; a type JSON would fold into another is refused (a
    tuple is a list, but an int key would read as the string key of the same digits)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no digest of a non-finite number: {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        return [_checked(item) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(name, str) for name in value):
            raise TypeError("a mapping in a digest needs string keys")
        return {name: _checked(item) for name, item in value.items()}
    raise TypeError(f"no digest of a {type(value).__name__}")


def canonical(value: Any) -> bytes:
    """The one encoding of `value`: sorted keys, no spaces, ASCII only (a lone surrogate
    is escaped, never an encoding error)."""
    text = json.dumps(_checked(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode("ascii")


def digest(value: Any) -> str:
    """The SHA-256 (hex) of `value`'s canonical encoding: equal only for equal content."""
    return hashlib.sha256(canonical(value)).hexdigest()
