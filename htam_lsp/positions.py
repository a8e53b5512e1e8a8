"""UTF-8 byte offsets (tree-sitter) <-> LSP positions in the negotiated encoding.

Lines end at `\\n`, `\\r\\n` or `\\r`, as the LSP specification says. Columns are counted
in UTF-8 bytes, UTF-16 code units or code points, depending on the encoding the client
and server agreed on (VS Code: utf-16; Neovim: utf-8).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
_NEWLINE = re.compile(rb"\r\n|\r|\n")


def encode(text: str) -> bytes:
    """UTF-8 bytes of `text`; lone surrogates (from invalid input) survive as 3 bytes."""
    return text.encode("utf-8", "surrogatepass")


def decode(data: bytes) -> str:
    """The inverse of `encode`; bytes that are not UTF-8 become U+FFFD."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def _units(text: str, encoding: str) -> int:
    if encoding == UTF16:
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    if encoding == UTF8:
        return len(encode(text))
    return len(text)


class LineIndex:
    """Line starts of one immutable byte buffer, for position conversion."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        if b"\r" in data:
            breaks = [(m.start(), m.end()) for m in _NEWLINE.finditer(data)]
            self.starts = [0] + [end for _start, end in breaks]
            self._ends = [start for start, _end in breaks] + [len(data)]
        else:  # the common case, without a regex match object per line (rebuilt per edit)
            self.starts = [0, *accumulate(len(line) + 1 for line in data.split(b"\n")[:-1])]
            self._ends = [start - 1 for start in self.starts[1:]] + [len(data)]

    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line_bytes(self, line: int) -> bytes:
        """The bytes of `line` without its line ending."""
        return self.data[self.starts[line] : self._ends[line]]

    def offset(self, line: int, character: int, encoding: str) -> int:
        """Byte offset of an LSP position; out-of-range positions clamp to the line or file."""
        if line < 0:
            return 0
        if line >= len(self.starts):
            return len(self.data)
        raw = self.line_bytes(line)
        character = max(character, 0)
        if encoding == UTF8:
            column = min(character, len(raw))
            while column > 0 and column < len(raw) and (raw[column] & 0xC0) == 0x80:
                column -= 1  # never split a UTF-8 sequence
            return self.starts[line] + column
        column = 0
        count = 0
        for char in decode(raw):
            if count >= character:
                break
            count += _units(char, encoding)
            column += len(encode(char))
        return self.starts[line] + min(column, len(raw))

    def point(self, offset: int) -> tuple[int, int]:
        """(row, byte column) of a byte offset, as tree-sitter counts them."""
        offset = min(max(offset, 0), len(self.data))
        line = bisect_right(self.starts, offset) - 1
        return line, offset - self.starts[line]

    def position(self, offset: int, encoding: str) -> tuple[int, int]:
        """LSP (line, character) of a byte offset in `encoding`."""
        line, column = self.point(offset)
        column = min(column, self._ends[line] - self.starts[line])
        if encoding == UTF8:
            return line, column
        prefix = self.data[self.starts[line] : self.starts[line] + column]
        if prefix.isascii():  # one unit per byte in every encoding
            return line, column
        return line, _units(decode(prefix), encoding)
