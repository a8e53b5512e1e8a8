"""What HTAM learned about one server and model across runs: the structured-output forms
it refused (so a refused `json_schema` costs one request once, not once per run) and
its measured output speed (so a slow local model gets limits it can finish).

Kept in `llm/servers.json` under the HTAM home, keyed by provider, base URL and model;
every update is a read-modify-write under a file lock, written to a temporary file and
renamed over the old one, so a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from htam_engine.paths import subdir

FILE = "servers.json"
RATE_WEIGHT = 0.5  # the newest measurement's weight in the running tokens/s estimate


def server_key(provider: str, base_url: str | None, model: str) -> str:
    return f"{provider} {base_url or 'default'} {model}"


def _path() -> Path:
    return subdir("llm") / FILE


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def _locked() -> Iterator[Path]:
    path = _path()
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _update(key: str, change: Callable[[dict[str, Any]], None]) -> None:
    with _locked() as path:
        data = _read(path)
        found = data.get(key)
        kept: dict[str, Any] = found if isinstance(found, dict) else {}
        change(kept)
        data[key] = kept
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".servers-")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
        os.replace(partial, path)


def entry(key: str) -> dict[str, Any]:
    found = _read(_path()).get(key)
    return found if isinstance(found, dict) else {}


def known_forms(key: str, forms: Sequence[str]) -> list[str]:
    """`forms` without those this server refused before (never empty: the last stays)."""
    refused = {f for f in entry(key).get("refused_forms", []) if isinstance(f, str)}
    kept = [f for f in forms if f not in refused]
    return kept or list(forms[-1:])


def refuse_form(key: str, form: str) -> None:
    def change(found: dict[str, Any]) -> None:
        refused = [f for f in found.get("refused_forms", []) if isinstance(f, str)]
        found["refused_forms"] = sorted({*refused, form})

    _update(key, change)


def tokens_per_s(key: str) -> float | None:
    rate = entry(key).get("tokens_per_s")
    return float(rate) if isinstance(rate, int | float) and rate > 0 else None


def record_speed(key: str, output_tokens: int, seconds: float) -> float | None:
    """Fold one call's output speed in (calls too short to say anything are skipped);
    returns the new estimate."""
    if output_tokens < 16 or seconds <= 0:
        return tokens_per_s(key)
    measured = output_tokens / seconds
    result: list[float] = []

    def change(found: dict[str, Any]) -> None:
        old = found.get("tokens_per_s")
        rate = measured
        if isinstance(old, int | float) and old > 0:
            rate = (1 - RATE_WEIGHT) * float(old) + RATE_WEIGHT * measured
        found["tokens_per_s"] = round(rate, 3)
        result.append(rate)

    _update(key, change)
    return result[0]
