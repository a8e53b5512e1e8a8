"""Diagnostics: static hints, an unbound .cu file, and where code failed to compile:
the user's own (a compile check) or the last candidate of a step."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lsprotocol import types as t

from htam_lsp import discovery, insight
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

SOURCE = "htam"
# Where a compiler line says it is: the evaluator's scratch file (`kernel.cu(6): `) or the
# server's copy of the buffer (`/.../htam-1234-5.py:7: `); the diagnostic's range says it.
_LOCATION = re.compile(r"^\S*?(?:kernel\.cu|htam-\d+-\d+\.\w+)(?:\((\d+)\)|:(\d+))?:?\s*")


@dataclass(frozen=True)
class CompileError:
    """Code that failed to compile: its text, the 1-based line the compiler named there,
    the evaluator's message, and whether it was the user's own code (a compile check of
    the buffer) or a step's candidate."""

    source: str
    line: int
    message: str
    yours: bool


def compiler_words(message: str) -> str:
    """The compiler's own first error, without the evaluator's preamble ("no GPU here:
    nvcc rejected the kernel") or the name of a scratch file it compiled."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    said = lines[1:] or lines
    first = next((line for line in said if "error" in line.lower()), said[0] if said else "")
    return _LOCATION.sub("", first) or "compile error"


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
        found.append(_compile_diagnostic(ls, doc, error))
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


def _compile_diagnostic(ls: HtamServer, doc: Document, error: CompileError) -> t.Diagnostic:
    row = min(map_line(error.source, doc.text, max(error.line - 1, 0)), doc.index.line_count - 1)
    start = doc.index.starts[row]
    end = start + len(doc.index.line_bytes(row))
    said = compiler_words(error.message)
    if error.yours:
        message = f"HTAM compile check: nvcc rejects this line: {said}"
    else:
        message = f"HTAM: the last candidate failed to compile here (its line {error.line}): {said}"
    return t.Diagnostic(
        range=ls.lsp_range(doc, start, end),
        message=message,
        severity=t.DiagnosticSeverity.Error,
        source=SOURCE,
        code="compile_check_error" if error.yours else "candidate_compile_error",
    )
