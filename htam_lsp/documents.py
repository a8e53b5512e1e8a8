"""Open documents: text, line index and a tree-sitter tree re-parsed incrementally.

The server keeps its own store (rather than pygls's workspace) because an incremental
re-parse needs the byte offsets of each edit in the text *before* the edit.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

import tree_sitter
import tree_sitter_cuda
import tree_sitter_python

from htam_engine.vocabulary import SUFFIX_LANGUAGES
from htam_lsp.positions import LineIndex, decode, encode

# Above this size a file is not a kernel: no parse, no HTAM features (and no stalls).
MAX_PARSE_BYTES = 2_000_000

_LANGUAGE_IDS = {"cuda": "cuda", "cuda-cpp": "cuda", "python": "python", "cpp": "cpp"}


@cache
def parser_for(language: str) -> tree_sitter.Parser:
    """A parser for "cuda", "cpp" (parsed with the CUDA grammar, a C++ superset) or "python"."""
    grammar = tree_sitter_python.language() if language == "python" else tree_sitter_cuda.language()
    return tree_sitter.Parser(tree_sitter.Language(grammar))


def language_of(uri: str, language_id: str) -> str | None:
    """ "cuda", "cpp", "python" or None (a language HTAM does not read)."""
    suffix = PurePosixPath(urlparse(uri).path).suffix.lower()
    return SUFFIX_LANGUAGES.get(suffix) or _LANGUAGE_IDS.get(language_id)


def uri_path(uri: str) -> str | None:
    """The file-system path of a file: URI, else None."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else None


@dataclass
class EmbeddedTree:
    """The tree of a C++/CUDA source held in a Python string literal (file bytes start..end)."""

    start: int
    end: int
    language: str
    tree: tree_sitter.Tree

    def follow(self, start: int, old_end: int, new: bytes, data: bytes) -> bool:
        """Keep this tree in step with an edit of the file; False when it cannot be kept.

        `data` is the file before the edit. An edit inside the literal is applied to the
        tree and re-parsed incrementally; one before it only moves it.
        """
        delta = len(new) - (old_end - start)
        if old_end <= self.start and start < self.start:
            self.start, self.end = self.start + delta, self.end + delta
            return True
        if start >= self.end and start > self.start:
            return True
        if not (self.start <= start and old_end <= self.end):
            return False
        inner = data[self.start : self.end]
        rel_start, rel_old_end = start - self.start, old_end - self.start
        edited = inner[:rel_start] + new + inner[rel_old_end:]
        self.tree.edit(
            rel_start,
            rel_old_end,
            rel_start + len(new),
            _point(inner, rel_start),
            _point(inner, rel_old_end),
            _point(edited, rel_start + len(new)),
        )
        self.tree = parser_for(self.language).parse(edited, self.tree)
        self.end += delta
        return True


def _point(data: bytes, offset: int) -> tuple[int, int]:
    return data.count(b"\n", 0, offset), offset - (data.rfind(b"\n", 0, offset) + 1)


def sanitize(data: bytes) -> bytes:
    """`data` with each byte of an invalid UTF-8 sequence replaced by `?`: same length, so
    every offset holds, and valid UTF-8 for the parsers and `htam_engine.parsing`."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "htam-same-length").encode("utf-8")
    return data


def _same_length(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return "?" * (error.end - error.start), error.end


codecs.register_error("htam-same-length", _same_length)


@dataclass
class Document:
    """One open document and its syntax tree (None when HTAM does not parse it).

    `data` is the text as UTF-8 (positions are counted in it); `source` is the same
    bytes made valid UTF-8 (see `sanitize`), which is what gets parsed.
    """

    uri: str
    language_id: str
    version: int
    data: bytes
    language: str | None = None
    tree: tree_sitter.Tree | None = None
    index: LineIndex = field(init=False)
    source: bytes = field(init=False)
    cache: dict[str, Any] = field(default_factory=dict)  # derived data of this version
    embedded: dict[int, EmbeddedTree] = field(default_factory=dict)  # by start byte

    def __post_init__(self) -> None:
        self.index = LineIndex(self.data)
        self.source = sanitize(self.data)
        self.language = language_of(self.uri, self.language_id)
        self._parse(None)

    @property
    def text(self) -> str:
        return decode(self.data)

    @property
    def too_large(self) -> bool:
        return len(self.data) > MAX_PARSE_BYTES

    def _parse(self, old: tree_sitter.Tree | None) -> None:
        self.cache.clear()
        if self.language is None or self.too_large:
            self.tree = None
            return
        parser = parser_for(self.language)
        self.tree = parser.parse(self.source, old) if old is not None else parser.parse(self.source)

    def embedded_tree(self, start: int, end: int, language: str) -> tree_sitter.Tree:
        """The tree of the embedded source at file bytes start..end (kept incrementally)."""
        held = self.embedded.get(start)
        if held is None or held.end != end or held.language != language:
            parsed = parser_for(language).parse(self.source[start:end])
            held = self.embedded[start] = EmbeddedTree(start, end, language, parsed)
        return held.tree

    def replace(self, text: str, version: int) -> None:
        """A whole-document change."""
        self.embedded.clear()
        self.data, self.version = encode(text), version
        self.index = LineIndex(self.data)
        self.source = sanitize(self.data)
        self._parse(None)

    def edit(self, start: tuple[int, int], end: tuple[int, int], text: str, encoding: str) -> None:
        """An incremental change of the range start..end (LSP line/character) to `text`."""
        start_byte = self.index.offset(*start, encoding)
        old_end_byte = max(self.index.offset(*end, encoding), start_byte)
        new = encode(text)
        start_point = self.index.point(start_byte)
        old_end_point = self.index.point(old_end_byte)
        self.data = self.data[:start_byte] + new + self.data[old_end_byte:]
        self.index = LineIndex(self.data)
        old_source, self.source = self.source, sanitize(self.data)
        new_source = self.source[start_byte : start_byte + len(new)]
        kept = [
            e
            for e in self.embedded.values()
            if e.follow(start_byte, old_end_byte, new_source, old_source)
        ]
        self.embedded = {e.start: e for e in kept}
        new_end_byte = start_byte + len(new)
        old = self.tree
        if old is not None and not self.too_large:
            old.edit(
                start_byte,
                old_end_byte,
                new_end_byte,
                start_point,
                old_end_point,
                self.index.point(new_end_byte),
            )
            self._parse(old)
        else:
            self._parse(None)


class DocumentStore:
    """The documents the client has open, by URI."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}

    def open(self, uri: str, language_id: str, version: int, text: str) -> Document:
        doc = Document(uri, language_id, version, encode(text))
        self._docs[uri] = doc
        return doc

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._docs.values()))
