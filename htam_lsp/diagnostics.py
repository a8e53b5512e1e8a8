"""Diagnostics: static hints, an unbound .cu file, and where the last candidate failed
to compile."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from lsprotocol import types as t

from htam_lsp import discovery, insight
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

SOURCE = "htam"


_HINT_SEVERITY = {
    "no_restrict": t.DiagnosticSeverity.Hint,
    "no_bounds_check": t.DiagnosticSeverity.Information,
}


def diagnostics(ls: HtamServer, doc: Document) -> list[t.Diagnostic]:
    found = []
    units = discovery.units(doc)
    for unit in units:
        for hint in discovery.hints(unit):
            found.append(
                t.Diagnostic(
                    range=ls.lsp_range(doc, hint.start_byte, hint.end_byte),
                    message=hint.message,
                    severity=_HINT_SEVERITY.get(hint.code, t.DiagnosticSeverity.Hint),
                    source=SOURCE,
                    code=hint.code,
                )
            )
    first = next((u for u in units if u.kind == "global"), None)
    if first is not None and insight.needs_binding(doc):
        found.append(unbound_diagnostic(ls, doc, first))
    error = ls.runs.compile_errors.get(doc.uri)
    if error is not None:
        found.append(_compile_diagnostic(ls, doc, *error))
    return found


def unbound_diagnostic(ls: HtamServer, doc: Document, unit: Unit) -> t.Diagnostic:
    return t.Diagnostic(
        range=ls.lsp_range(doc, unit.name_start, unit.name_end),
        message=(
            "HTAM: this file is not bound to a PyTorch reference, so it cannot be verified "
            "or timed; add `// htam: reference=REF.py entry=HOST_FUNCTION` (quick fix "
            "available) or an htam.toml [[kernel]] entry"
        ),
        severity=t.DiagnosticSeverity.Information,
        source=SOURCE,
        code="unbound",
    )


def map_line(candidate: str, current: str, line: int) -> int:
    """The line of `current` that corresponds to 0-based `line` of `candidate`."""
    matcher = difflib.SequenceMatcher(
        None, candidate.splitlines(), current.splitlines(), autojunk=False
    )
    for tag, c1, c2, d1, _d2 in matcher.get_opcodes():
        if c1 <= line < c2 or (tag == "insert" and c1 == line):
            return d1 + (line - c1 if tag == "equal" else 0)
    return max(len(current.splitlines()) - 1, 0)


def _compile_diagnostic(
    ls: HtamServer, doc: Document, candidate: str, line: int, message: str
) -> t.Diagnostic:
    row = min(map_line(candidate, doc.text, max(line - 1, 0)), doc.index.line_count - 1)
    start = doc.index.starts[row]
    end = start + len(doc.index.line_bytes(row))
    excerpt = message.strip().splitlines()[0] if message.strip() else "compile error"
    return t.Diagnostic(
        range=ls.lsp_range(doc, start, end),
        message=f"HTAM: the last candidate failed to compile here (its line {line}): {excerpt}",
        severity=t.DiagnosticSeverity.Error,
        source=SOURCE,
        code="candidate_compile_error",
    )
