"""Parsing with tree-sitter and walking the trees: the ground every other view stands on.

C++ is parsed with the CUDA grammar, a superset of the C++ one.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import tree_sitter_cuda
import tree_sitter_python
from tree_sitter import Language, Node, Parser, Tree

from htam_engine.vocabulary import LANGUAGES


@cache
def _parser(language: str) -> Parser:
    grammar = tree_sitter_python if language == "python" else tree_sitter_cuda
    return Parser(Language(grammar.language()))


def as_bytes(source: str | bytes) -> bytes:
    return source.encode(errors="surrogatepass") if isinstance(source, str) else source


def parse(source: str | bytes, language: str) -> Tree:
    """Parse `source` as "cuda", "cpp" (CUDA grammar) or "python"."""
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; expected one of {LANGUAGES}")
    return _parser(language).parse(as_bytes(source))


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node` (itself included), in document order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def text(node: Node | None) -> str:
    """The node's text; invalid UTF-8 (a user's broken file) becomes U+FFFD, never an error."""
    return "" if node is None or node.text is None else node.text.decode(errors="replace")


def has_errors(source: str | bytes, language: str) -> bool:
    """True when the parse tree holds ERROR or MISSING nodes."""
    return parse(source, language).root_node.has_error
