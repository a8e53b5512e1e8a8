"""Responses serialized once per document version instead of once per request.

pygls turns every result into JSON through its cattrs converter on each request: for the
~400 symbols of a 5,000-line file that was ~5 ms of unstructuring and encoding per
documentSymbol, the largest part of its p99. A handler can instead return `Prerendered`:
a list of JSON-ready values that carries its own JSON text, which `HtamProtocol` writes
as the response's result verbatim. Without the fast path (another protocol class) the
list still serializes correctly, only slower.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from pygls.protocol import LanguageServerProtocol


class Prerendered(list[Any]):
    """JSON-ready values (dicts, lists, numbers, strings) and their JSON text."""

    def __init__(self, values: list[Any]) -> None:
        super().__init__(values)
        self.json = json.dumps(values, separators=(",", ":"))


class HtamProtocol(LanguageServerProtocol):
    """pygls's protocol, writing `Prerendered` results without converting them again."""

    def _send_data(self, data: Any) -> None:
        result = getattr(data, "result", None)
        if not isinstance(result, Prerendered) or self.writer is None:
            super()._send_data(data)
            return
        body = f'{{"id":{json.dumps(data.id)},"jsonrpc":"{self.VERSION}","result":{result.json}}}'
        encoded = body.encode(self.CHARSET)
        header = (
            f"Content-Length: {len(encoded)}\r\n"
            f"Content-Type: {self.CONTENT_TYPE}; charset={self.CHARSET}\r\n\r\n"
            if self._include_headers
            else ""
        )
        written = self.writer.write(header.encode(self.CHARSET) + encoded)
        if inspect.isawaitable(written):  # the websocket writer
            asyncio.ensure_future(written)
