"""Document symbols: the kernel units of a document as a hierarchy (units nested by range)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lsprotocol import types as t

from htam_lsp import discovery
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.protocol import Prerendered

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

_SYMBOL_KINDS = {
    "global": t.SymbolKind.Function,
    "host": t.SymbolKind.Function,
    "model": t.SymbolKind.Class,
    "module": t.SymbolKind.Module,
}


def unit_detail(unit: Unit) -> str:
    if unit.kind == "global":
        launched = f", launched by {', '.join(unit.launchers)}" if unit.launchers else ""
        return f"__global__ kernel{launched}"
    if unit.kind == "host":
        return "C++ kernel (CPU)" if unit.language == "cpp" else "host function"
    return {"model": "KernelBench model", "module": "inline extension"}.get(unit.kind, unit.kind)


def symbols(ls: HtamServer, doc: Document) -> Prerendered:
    """Kernel units as a hierarchy (units nested by range), built and serialized once per
    version: JSON-ready dicts, since pygls would otherwise convert ~400 objects per request."""
    encoding = ls.encoding
    key = f"symbols:{encoding}"
    if key not in doc.cache:
        doc.cache[key] = Prerendered(_symbol_tree(doc, encoding))
    cached: Prerendered = doc.cache[key]
    return cached


def _symbol_tree(doc: Document, encoding: str) -> list[dict[str, Any]]:
    roots: list[dict[str, Any]] = []
    stack: list[tuple[Unit, dict[str, Any]]] = []
    for unit in sorted(discovery.units(doc), key=lambda u: (u.start_byte, -u.end_byte)):
        symbol = {
            "name": unit.name or "<anonymous>",
            "detail": unit_detail(unit),
            "kind": int(_SYMBOL_KINDS.get(unit.kind, t.SymbolKind.Function)),
            "range": _range_json(doc, unit.start_byte, unit.end_byte, encoding),
            "selectionRange": _range_json(doc, unit.name_start, unit.name_end, encoding),
        }
        while stack and stack[-1][0].end_byte < unit.end_byte:
            stack.pop()
        if stack:
            stack[-1][1].setdefault("children", []).append(symbol)
        else:
            roots.append(symbol)
        stack.append((unit, symbol))
    return roots


def _range_json(doc: Document, start: int, end: int, encoding: str) -> dict[str, Any]:
    (sl, sc), (el, ec) = doc.index.position(start, encoding), doc.index.position(end, encoding)
    return {"start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}}
