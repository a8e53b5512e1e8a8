"""Cassettes: JSONL files of recorded answers, for reproducible runs and demos.

One line per call: `key` (hash of system + prompt), `purpose`, `provider`, `model`,
`system`, `prompt`, `text`, `input_tokens`, `output_tokens`, `cost_usd`, and since the
structured forms `form`, `truncated` and `latency_s` (older cassettes: `prompted` for a JSON answer,
and truncated when the answer is as long as the call's limit). Everything written is
passed through `redact`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from htam_engine.llm.base import Completion, LLMError, LLMRequest, Provider, redact
from htam_engine.llm.cache import prompt_key


def cassette_key(system: str, prompt: str) -> str:
    return prompt_key(system, prompt)


def read_cassette(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise LLMError(f"cannot read cassette {path}: {error.strerror or error}") from None
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            raise LLMError(f"cassette {path}, line {number}: not a JSON object") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            raise LLMError(f"cassette {path}, line {number}: needs a string 'text'")
        entries.append(entry)
    return entries


class ReplayProvider(Provider):
    """Answers from a cassette: the unused entry with the same prompt hash, else the next
    unused entry recorded for the same purpose (local choice or generation), else the next
    unused one (prompts that embed measured numbers never hash the same)."""

    name = "replay"

    def __init__(self, cassette: Path) -> None:
        super().__init__()
        self.cassette = Path(cassette)
        self._entries = read_cassette(self.cassette)
        self.model = str(self._entries[0].get("model", "replay")) if self._entries else "replay"
        self._used = [False] * len(self._entries)
        self._lock = threading.Lock()

    def _pick(self, key: str, purpose: str) -> dict[str, Any]:
        free = [i for i, used in enumerate(self._used) if not used]
        if not free:
            raise LLMError(
                f"cassette {self.cassette} has no answer left for this {purpose or 'call'} "
                f"(all {len(self._entries)} recorded answers were used)"
            )
        exact = [i for i in free if self._entries[i].get("key") == key]
        same_purpose = [i for i in free if self._entries[i].get("purpose") == purpose]
        index = (exact or same_purpose or free)[0]
        self._used[index] = True
        return self._entries[index]

    def _complete(self, request: LLMRequest) -> Completion:
        started = time.perf_counter()
        with self._lock:
            entry = self._pick(cassette_key(request.system, request.prompt), request.purpose)
        output_tokens = int(entry.get("output_tokens", 0))
        return Completion(
            entry["text"],
            int(entry.get("input_tokens", 0)),
            output_tokens,
            0.0,
            True,
            time.perf_counter() - started,
            form=str(entry.get("form") or ("prompted" if request.schema else "text")),
            truncated=bool(entry.get("truncated", output_tokens >= request.max_tokens)),
        )


class Recorder(Provider):
    """Wraps a provider and appends each of its answers to a cassette."""

    def __init__(self, inner: Provider, cassette: Path) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.reasoning = inner.reasoning
        self.cassette = Path(cassette)
        self.cassette.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _complete(self, request: LLMRequest) -> Completion:
        completion = self.inner.send(request)
        entry = {
            "key": cassette_key(request.system, request.prompt),
            "purpose": request.purpose,
            "provider": self.name,
            "model": self.model,
            "system": request.system,
            "prompt": request.prompt,
            "text": completion.text,
            "input_tokens": completion.input_tokens,
            "output_tokens": completion.output_tokens,
            "cost_usd": completion.cost_usd,
            "form": completion.form,
            "truncated": completion.truncated,
            "latency_s": completion.latency_s,
        }
        line = redact(json.dumps(entry, ensure_ascii=False))
        with self._lock, self.cassette.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        return completion
