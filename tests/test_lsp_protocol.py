"""The pre-serialized response path: the same JSON-RPC message as pygls's own, framed right."""

from __future__ import annotations

import io
import json
from typing import Any

from lsprotocol import types as t
from pygls.io_ import StdoutWriter

from htam_lsp import symbols as lsp_symbols
from htam_lsp.protocol import HtamProtocol, Prerendered
from htam_lsp.server import HtamServer

CUDA = """__global__ void scale(const float* a, float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // é 𝛼
    if (i < n) b[i] = 2.0f * a[i];
}

void launch(const float* a, float* b, int n) {
    scale<<<(n + 255) / 256, 256>>>(a, b, n);
}
"""


def _frames(raw: bytes) -> list[dict[str, Any]]:
    """Parse Content-Length framed messages, checking each length against its body."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body, raw = rest[:length], rest[length:]
        assert len(body) == length
        found.append(json.loads(body))
    return found


def _sent(result: Any, msg_id: int = 7) -> tuple[bytes, dict[str, Any]]:
    server = HtamServer()
    out = io.BytesIO()
    assert isinstance(server.protocol, HtamProtocol)
    server.protocol.set_writer(StdoutWriter(out))
    server.protocol._send_response(msg_id, result=result)
    [message] = _frames(out.getvalue())
    return out.getvalue(), message


def test_prerendered_result_is_the_message_pygls_would_send():
    values = [{"name": "k", "detail": 'é 𝛼 "quoted"', "kind": 12, "children": []}]
    rendered = Prerendered(values)
    raw, fast = _sent(rendered)
    assert rendered.json.encode() in raw  # written verbatim, not converted again
    assert fast == {"id": 7, "jsonrpc": "2.0", "result": values}
    _raw, plain = _sent(list(values))
    assert plain == fast


def test_symbols_json_matches_lsprotocol_document_symbols():
    """The hand-built dicts structure into DocumentSymbol and back to the same JSON."""
    server = HtamServer()
    doc = server.docs.open("file:///w/k.cu", "cuda", 1, CUDA)
    symbols = lsp_symbols.symbols(server, doc)
    assert lsp_symbols.symbols(server, doc) is symbols  # built once per version
    converter = server.protocol._converter
    typed = converter.structure(json.loads(symbols.json), list[t.DocumentSymbol])
    assert [s.name for s in typed] == ["scale", "launch"]
    assert typed[0].kind == t.SymbolKind.Function
    assert typed[0].selection_range.start == t.Position(0, 16)
    assert converter.unstructure(typed) == list(symbols)
    doc.edit((0, 0), (0, 0), "\n", "utf-16")
    moved = lsp_symbols.symbols(server, doc)
    assert moved is not symbols and moved[0]["range"]["start"]["line"] == 1
