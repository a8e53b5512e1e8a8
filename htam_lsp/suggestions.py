"""What the server learned per kernel: the steps of its runs and their candidates.

Records live in the shared `MemoryStore` (namespace "lsp-suggestions", key
"<uri>#<kernel>") so that suggestions and history survive a server restart. A
record's suggestions belong to the text the runs started from (`start_hash`): when
the document no longer has that text, its candidates are no longer offered.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from htam_engine.memory import MemoryStore

log = logging.getLogger(__name__)

NAMESPACE = "lsp-suggestions"
HISTORY_LIMIT = 50
_VERDICT_KEYS = (
    "compiled",
    "correct",
    "runtime_ms",
    "ref_runtime_ms",
    "speedup",
    "device",
    "error",
    "suspect",
    "inputs_checked",
    "cached",
)


def text_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def record_key(uri: str, kernel: str) -> str:
    return f"{uri}#{kernel}"


@dataclass(frozen=True)
class Suggestion:
    """A verified candidate of one step, ready to become a code action."""

    index: int  # position in the record's history
    global_id: str
    local_id: str
    speedup: float | None  # over the starting text
    ref_speedup: float | None  # over the PyTorch reference
    inputs: int
    source: str


def trim_step(event: dict[str, Any], start_hash: str, number: int) -> dict[str, Any]:
    """The part of a `step` event worth keeping; the source only for correct candidates."""
    verdict = event.get("verdict") or {}
    correct = bool(verdict.get("correct"))
    return {
        "n": number,
        "step": event.get("step"),
        "global": event.get("global", ""),
        "local": event.get("local", ""),
        "reason": event.get("reason", ""),
        "status": event.get("status", ""),
        "speedup": event.get("speedup"),
        "decision": event.get("decision") or {},
        "local_decision": event.get("local_decision") or {},
        "verdict": {k: verdict.get(k) for k in _VERDICT_KEYS if k in verdict},
        "source": event.get("source") if correct and event.get("source") else None,
        "start_hash": start_hash,
        "time": time.time(),
    }


def add_step(record: dict[str, Any] | None, step: dict[str, Any]) -> dict[str, Any]:
    """The record with `step` appended (older candidate sources dropped past the limit)."""
    history = [*(record or {}).get("history", []), step][-HISTORY_LIMIT:]
    return {**(record or {}), "history": history}


def suggestions(record: dict[str, Any] | None, current_hash: str) -> list[Suggestion]:
    """Verified candidates for the current text, best per strategy, fastest first."""
    best: dict[str, Suggestion] = {}
    for index, step in enumerate((record or {}).get("history", [])):
        if step.get("start_hash") != current_hash or not step.get("source"):
            continue
        verdict = step.get("verdict", {})
        candidate = Suggestion(
            index=index,
            global_id=step.get("global", ""),
            local_id=step.get("local", ""),
            speedup=step.get("speedup"),
            ref_speedup=verdict.get("speedup"),
            inputs=int(verdict.get("inputs_checked") or 0),
            source=step["source"],
        )
        held = best.get(candidate.local_id)
        if held is None or _rank(candidate) > _rank(held):
            best[candidate.local_id] = candidate
    return sorted(best.values(), key=_rank, reverse=True)


def _rank(s: Suggestion) -> float:
    return s.speedup if s.speedup is not None else 0.0


def best_speedup(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The history step with the largest measured speedup over its start, if any."""
    measured = [
        s
        for s in (record or {}).get("history", [])
        if s.get("speedup") and (s.get("verdict") or {}).get("correct")
    ]
    return max(measured, key=lambda s: s["speedup"]) if measured else None


class SuggestionStore:
    """Records in the shared memory store, with an in-process cache (reads are hot).

    Reads use a store opened in the server's thread; writes go to a second store owned
    by one writer thread, because a write may wait for a worker's transaction and the
    event loop must not.
    """

    def __init__(self, home: Path | None = None) -> None:
        self._home = home  # None: the shared HTAM home
        self._reader: MemoryStore | None = None
        self._writer: MemoryStore | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="htam-store")
        self._cache: dict[str, dict[str, Any] | None] = {}

    @property
    def store(self) -> MemoryStore:
        """The reading `MemoryStore`, opened on first use (keeps start-up light)."""
        if self._reader is None:
            from htam_engine.memory import MemoryStore

            self._reader = MemoryStore(self._home)
        return self._reader

    def get(self, uri: str, kernel: str) -> dict[str, Any] | None:
        key = record_key(uri, kernel)
        if key not in self._cache:
            self._cache[key] = self.store.get(NAMESPACE, key)
        return self._cache[key]

    def put(self, uri: str, kernel: str, record: dict[str, Any]) -> Future[None]:
        """Update the cache now and the store in the writer thread."""
        key = record_key(uri, kernel)
        self._cache[key] = record
        return self._pool.submit(self._write, key, record)

    def _write(self, key: str, record: dict[str, Any]) -> None:
        if self._writer is None:
            from htam_engine.memory import MemoryStore

            self._writer = MemoryStore(self._home)
        try:
            self._writer.put(NAMESPACE, key, record)
        except Exception:
            log.exception("could not store the HTAM record %s", key)
