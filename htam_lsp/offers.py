"""What a document's history offers its current text, and the facts of each suggestion:
shared by the lenses, the hover, the code actions and htam.results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lsprotocol import types as t

from htam_engine import parsing
from htam_lsp import insight, render
from htam_lsp import suggestions as sg
from htam_lsp.documents import Document
from htam_lsp.positions import encode

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph
    from htam_lsp.server import HtamServer


def offered(ls: HtamServer, doc: Document) -> sg.Offer:
    """What the kernel's history offers the document's current text (cached per version,
    history and threshold: a step that ends without an edit changes the answer)."""
    history = ls.records.history(doc.uri)
    key = f"offer:{ls.records.revision}:{ls.settings.min_speedup}"
    if key not in doc.cache:
        text = doc.text if history else ""  # no history: no need to decode the file
        doc.cache[key] = sg.offer(history, text, ls.settings.min_speedup)
    cached: sg.Offer = doc.cache[key]
    return cached


def applied_text(doc: Document, suggestion: sg.Suggestion) -> str:
    text = doc.text
    return text[: suggestion.start] + suggestion.new + text[suggestion.end :]


def suggestion_facts(record: sg.StepRecord) -> dict[str, Any]:
    """The machine-readable facts of a suggestion (`CodeAction.data`)."""
    step, claim = record.step, record.claim
    return {
        "n": record.n,
        "globalId": step.global_id,
        "localId": step.local_id,
        "confirmed": record.confirmed,  # the engine's word, timed in pairs
        "versus": claim.versus if claim else None,  # 0: your code; N: candidate #N
        "speedup": claim.speedup if claim else None,
        "speedupLow": claim.low if claim else None,
        "speedupHigh": claim.high if claim else None,
        "estimate": record.estimate,  # the ratio over PyTorch's: never timed in pairs
        "refSpeedup": step.ref_speedup,
        "startMs": record.start_ms,
        "runtimeMs": record.runtime_ms,
        "refMs": record.ref_ms,
        "inputs": record.inputs,
        "nonPortable": record.non_portable,
        "sandbox": step.verdict.sandbox,
    }


def also_adds(graph: Graph, doc: Document, suggestion: sg.Suggestion) -> list[str]:
    """Static features the whole edit adds that its strategy's name does not already say
    (e.g. a flags strategy that also adds __restrict__: "restrict pointers")."""
    key = f"also:{suggestion.record.n}"
    if key not in doc.cache:
        back = insight.backend(doc)
        before = parsing.features(doc.source, back)
        after = parsing.features(encode(applied_text(doc, suggestion)), back)
        name = render.node_name(graph, suggestion.record.step.local_id).lower()
        gained = sorted(tag for tag in after - before if not tag.startswith("no_"))
        doc.cache[key] = [tag.replace("_", " ") for tag in gained if not _said(tag, name)]
    cached: list[str] = doc.cache[key]
    return cached


def _said(tag: str, name: str) -> bool:
    """Whether a strategy's name already says what the feature tag says."""
    words = [w for w in tag.lower().split("_") if w not in ("opt", "loads", "pointers")]
    return all(w in name for w in words)


def minimal_change(old: bytes, new: bytes) -> tuple[int, int, bytes]:
    """(start, end in old, replacement): old[:start] + replacement + old[end:] == new."""
    limit = min(len(old), len(new))
    prefix = 0
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    while prefix > 0 and prefix < len(old) and (old[prefix] & 0xC0) == 0x80:
        prefix -= 1  # keep whole UTF-8 sequences
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    while suffix > 0 and (old[len(old) - suffix] & 0xC0) == 0x80:
        suffix -= 1
    return prefix, len(old) - suffix, new[prefix : len(new) - suffix]


def first_changed_line(doc: Document, suggestion: sg.Suggestion) -> int:
    text = doc.text
    old, new = encode(text[suggestion.start : suggestion.end]), encode(suggestion.new)
    start, _end, _new = minimal_change(old, new)
    return doc.index.point(len(encode(text[: suggestion.start])) + start)[0]


def position_json(position: t.Position) -> dict[str, int]:
    return {"line": position.line, "character": position.character}
