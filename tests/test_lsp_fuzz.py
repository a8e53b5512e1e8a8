"""Hypothesis fuzz of the document layer and the server's document handlers (in process).

The handlers are called unguarded (`__wrapped__`), so any exception fails the test
instead of being logged and swallowed by the server's safety net.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from helpers.lsp import apply_edits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types as t
from pytest_lsp import client_capabilities

from htam_engine import parsing
from htam_lsp import server as srv
from htam_lsp.documents import Document, parser_for

TOKENS = [
    "a", "n", " ", "\t", "\n", "\r\n", "{", "}", "(", ")", ";", "<", ">", "*", '"', "é", "𝛼",
    "\x00", "\udcff", "__global__ void k(float* a, int n) {", "int i = threadIdx.x;",
    "if (i < n)", "a[i] = 0;", 'x = load_inline(name="m", cuda_sources="', '"""',
    "class ModelNew:", "    def forward(self, x):", "# htam: reference=ref.py",
    'load_inline(name="m", cuda_sources=SRC)', 'SRC = r"""', "__global__ void g() { }",
]  # fmt: skip
texts = st.lists(st.sampled_from(TOKENS), max_size=30).map("".join)
ENCODINGS = ("utf-8", "utf-16")


def _units(char: str, encoding: str) -> int:
    size = len(char.encode("utf-8" if encoding == "utf-8" else "utf-16-le", "surrogatepass"))
    return size if encoding == "utf-8" else size // 2


def valid_position(data: st.DataObject, text: str, encoding: str) -> t.Position:
    """A position on a character boundary of `text`, in `encoding` units."""
    lines = text.splitlines() or [""]
    line = data.draw(st.integers(0, len(lines)))
    content = lines[line] if line < len(lines) else ""
    chars = data.draw(st.integers(0, len(content)))
    return t.Position(line, sum(_units(c, encoding) for c in content[:chars]))


def _ordered(a: t.Position, b: t.Position) -> tuple[t.Position, t.Position]:
    return (a, b) if (a.line, a.character) <= (b.line, b.character) else (b, a)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), text=texts, language=st.sampled_from(["cuda", "python"]))
def test_incremental_edits_match_text_and_fresh_parse(
    data: st.DataObject, text: str, language: str
) -> None:
    encoding = data.draw(st.sampled_from(ENCODINGS))
    suffix = ".cu" if language == "cuda" else ".py"
    doc = Document(f"file:///f{suffix}", language, 1, text.encode("utf-8", "surrogatepass"))
    expected = text
    for _ in range(data.draw(st.integers(1, 6))):
        start, end = _ordered(
            valid_position(data, expected, encoding), valid_position(data, expected, encoding)
        )
        new = data.draw(texts)
        doc.edit((start.line, start.character), (end.line, end.character), new, encoding)
        expected = apply_edits(expected, [t.TextEdit(t.Range(start, end), new)], encoding)
        assert doc.text == expected
        assert len(doc.source) == len(doc.data)  # sanitizing keeps every offset
        fresh = parser_for(language).parse(doc.source)
        assert doc.tree is not None and str(doc.tree.root_node) == str(fresh.root_node)
        if language == "python":  # embedded sources: trees kept incrementally, or re-parsed
            for embedded in parsing.embedded_sources(doc.source):
                kept = doc.embedded_tree(embedded.start_byte, embedded.end_byte, embedded.language)
                alone = parser_for(embedded.language).parse(embedded.text.encode())
                assert str(kept.root_node) == str(alone.root_node)


def _server(encoding: str, home: Path) -> srv.HtamServer:
    """A server object initialized through pygls's own initialize (no transport)."""
    ls = srv.HtamServer(home=home)
    caps = client_capabilities("neovim" if encoding == "utf-8" else "visual-studio-code")
    params = t.InitializeParams(capabilities=caps, initialization_options={"allowExecution": False})
    steps = ls.protocol.lsp_initialize(params)
    try:
        handler, args, _ = next(steps)
        while True:
            handler, args, _ = steps.send(handler(*args))
    except StopIteration:
        pass
    srv.initialize.__wrapped__(ls, params)  # type: ignore[attr-defined]
    return ls


uris = st.sampled_from(
    [
        "file:///w/k.cu",
        "file:///w/m.py",
        "file:///w/x.rs",
        "untitled:Untitled-1",
        "file:///w/gone.cu",
    ]
)
language_ids = st.sampled_from(["cuda", "cuda-cpp", "python", "rust", "", "plaintext"])
positions = st.builds(t.Position, st.integers(0, 40), st.integers(0, 200))
ranges = st.builds(t.Range, positions, positions)


def _operation(data: st.DataObject) -> tuple[str, Any]:
    uri = data.draw(uris)
    ident = t.TextDocumentIdentifier(uri)
    kind = data.draw(
        st.sampled_from(["open", "change", "full", "close", "hover", "symbols", "actions", "lens"])
    )
    if kind == "open":
        item = t.TextDocumentItem(uri, data.draw(language_ids), 1, data.draw(texts))
        return kind, t.DidOpenTextDocumentParams(item)
    if kind in ("change", "full"):
        change: Any = (
            t.TextDocumentContentChangePartial(range=data.draw(ranges), text=data.draw(texts))
            if kind == "change"
            else t.TextDocumentContentChangeWholeDocument(data.draw(texts))
        )
        version = t.VersionedTextDocumentIdentifier(version=data.draw(st.integers(2, 99)), uri=uri)
        return "change", t.DidChangeTextDocumentParams(version, [change])
    if kind == "close":
        return kind, t.DidCloseTextDocumentParams(ident)
    if kind == "hover":
        return kind, t.HoverParams(ident, data.draw(positions))
    if kind == "symbols":
        return kind, t.DocumentSymbolParams(ident)
    if kind == "lens":
        return kind, t.CodeLensParams(ident)
    return kind, t.CodeActionParams(ident, data.draw(ranges), t.CodeActionContext([]))


HANDLERS = {
    "open": srv.did_open,
    "change": srv.did_change,
    "close": srv.did_close,
    "hover": srv.hover,
    "symbols": srv.document_symbol,
    "actions": srv.code_action,
    "lens": srv.code_lens,
}
# One home for all examples is what the test wants: conftest's, from the `htam_home` fixture.
HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=120, deadline=None, suppress_health_check=HEALTH)
@given(data=st.data(), encoding=st.sampled_from(ENCODINGS))
def test_document_handlers_never_raise(data: st.DataObject, encoding: str, htam_home: Path) -> None:
    async def run() -> None:
        ls = _server(encoding, htam_home)
        for _ in range(data.draw(st.integers(1, 12))):
            kind, params = _operation(data)
            result = HANDLERS[kind].__wrapped__(ls, params)  # type: ignore[attr-defined]
            if kind in ("symbols", "actions", "lens"):
                assert isinstance(result, list)
            elif kind == "hover":
                assert result is None or isinstance(result.contents, t.MarkupContent)
        for doc in ls.docs:
            srv.diagnostics.diagnostics(ls, doc)  # what publishDiagnostics would send

    asyncio.run(run())
