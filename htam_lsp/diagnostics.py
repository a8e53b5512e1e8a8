"""Diagnostics: static hints, a kernel file not bound to its reference, and where code
failed to compile: the user's own (a compile check) or the last candidate of a step."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lsprotocol import types as t

from htam_lsp import discovery, insight
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

SOURCE = "htam"
# Where a compiler line says it is: the evaluator's scratch file (`kernel.cu(6): `,
# `kernel.cpp:13:9: `) or the server's copy of the buffer (`/.../htam-1234-5.py:7: `); the
# diagnostic's range says it.
_LOCATION = re.compile(
    r"^\S*?(?:kernel\.\w+|main\.\w+|htam-\d+-\d+\.\w+)(?:\(\d+\)|(?::\d+)+)?:?\s*"
)


Origin = Literal["check", "start", "candidate"]
_CODES = {
    "check": "compile_check_error",
    "start": "start_compile_error",
    "candidate": "candidate_compile_error",
}


@dataclass(frozen=True)
class CompileError:
    """Code that failed to compile: its text, the 1-based line the compiler named there,
    the evaluator's message, and whose it was: the user's own code (a compile check of the
    buffer, or the code a job started from) or a step's candidate."""

    source: str
    line: int
    message: str
    origin: Origin


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
    first = insight.binding_target(doc)
    if first is not None and insight.needs_binding(doc):
        found.append(unbound_diagnostic(ls, doc, first))
    error = ls.runs.compile_errors.get(doc.uri)
    if error is not None:
        found.append(_compile_diagnostic(ls, doc, error))
    return found


def unbound_diagnostic(ls: HtamServer, doc: Document, unit: Unit) -> t.Diagnostic:
    directive = (
        "# htam: reference=REF.py"
        if doc.language == "python"
        else "// htam: reference=REF.py entry=HOST_FUNCTION"
    )
    return t.Diagnostic(
        range=ls.lsp_range(doc, unit.name_start, unit.name_end),
        message=(
            "HTAM: this file is not bound to a PyTorch reference, so it cannot be verified "
            f"or timed; add `{directive}` (quick fix available) or an htam.toml [[kernel]] "
            "entry"
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
    message = {
        "check": f"HTAM compile check: nvcc rejects this line: {said}",
        "start": f"HTAM: your kernel does not compile here: {said}",
        "candidate": f"HTAM: the last candidate failed to compile here (its line {error.line}): "
        f"{said}",
    }[error.origin]
    return t.Diagnostic(
        range=ls.lsp_range(doc, start, end),
        message=message,
        severity=t.DiagnosticSeverity.Error,
        source=SOURCE,
        code=_CODES[error.origin],
    )
