"""Python source: loader calls (`load_inline` / `load_cpp`), their arguments and the
C++/CUDA sources and compiler flags passed to them as string literals."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from tree_sitter import Node, Tree

from htam_engine.parsing.trees import as_bytes, parse, text, walk

SOURCE_KWARGS = {"cpp_sources": "cpp", "cuda_sources": "cuda"}
LOADERS = ("load_inline", "load_cpp")


@dataclass(frozen=True)
class Embedded:
    """C++/CUDA text held in a Python string literal passed to a loader.

    `start_byte`/`end_byte` delimit the literal's content in the file's UTF-8 bytes, so
    `file_bytes[start_byte:end_byte].decode() == text`; `start_point` is its (row, byte
    column). `name` is the module-level variable holding it, or `<call>.<keyword>`.
    """

    name: str
    language: str  # "cuda" | "cpp"
    start_byte: int
    end_byte: int
    start_point: tuple[int, int]
    text: str
    call: str  # "load_inline" | "load_cpp"
    call_start_byte: int


def call_name(call: Node) -> str:
    func = call.child_by_field_name("function")
    if func is None:
        return ""
    return text(func).rsplit(".", 1)[-1]


def module_assignments(root: Node) -> dict[str, Node]:
    """Module-level `NAME = <value>` assignments (the last one wins)."""
    found: dict[str, Node] = {}
    for stmt in root.children:
        if stmt.type != "expression_statement" or not stmt.children:
            continue
        assign = stmt.children[0]
        left, right = assign.child_by_field_name("left"), assign.child_by_field_name("right")
        is_name = left is not None and left.type == "identifier"
        if assign.type == "assignment" and is_name and right is not None:
            found[text(left)] = right
    return found


def loader_calls(tree: Tree) -> list[Node]:
    """Calls to load_inline / load_cpp (any qualification) in a Python tree."""
    return [n for n in walk(tree.root_node) if n.type == "call" and call_name(n) in LOADERS]


def call_argument(call: Node, keyword: str, position: int | None = None) -> Node | None:
    """The value node of a keyword argument (or the positional one at `position`)."""
    args = call.child_by_field_name("arguments")
    if args is None:
        return None
    positional = [a for a in args.named_children if a.type not in ("keyword_argument", "comment")]
    for arg in args.named_children:
        if arg.type == "keyword_argument" and text(arg.child_by_field_name("name")) == keyword:
            return arg.child_by_field_name("value")
    if position is not None and position < len(positional):
        return positional[position]
    return None


def resolve(value: Node, assignments: dict[str, Node]) -> tuple[str | None, Node]:
    """Follow one module-level variable: (its name or None, the value node)."""
    if value.type == "identifier" and text(value) in assignments:
        return text(value), assignments[text(value)]
    return None, value


def _string_content(string: Node) -> tuple[int, int] | None:
    if string.type != "string" or any(c.type == "interpolation" for c in string.children):
        return None
    start = next(c for c in string.children if c.type == "string_start").end_byte
    end = next(c for c in string.children if c.type == "string_end").start_byte
    return start, end


def _source_values(call: Node) -> Iterator[tuple[str, str, Node]]:
    """(language, keyword, value node) for each source argument of a loader call."""
    if call_name(call) == "load_cpp":
        value = call_argument(call, "source", 1)
        if value is not None:
            yield "cpp", "source", value
        return
    for keyword, language in SOURCE_KWARGS.items():
        value = call_argument(call, keyword, 1 if keyword == "cpp_sources" else 2)
        if value is not None:
            yield language, keyword, value


def embedded_sources(python_source: str | bytes) -> list[Embedded]:
    """C++/CUDA sources passed as string literals (directly, in a list, or through a
    module-level variable) to `load_inline` (cpp_sources/cuda_sources) or `load_cpp`."""
    data = as_bytes(python_source)
    tree = parse(data, "python")
    assignments = module_assignments(tree.root_node)
    found: dict[int, Embedded] = {}
    for call in loader_calls(tree):
        for language, keyword, value in _source_values(call):
            name, node = resolve(value, assignments)
            items = node.named_children if node.type in ("list", "tuple") else [node]
            for item in items:
                item_name, literal = resolve(item, assignments)
                span = _string_content(literal)
                if span is None or span[0] in found:
                    continue
                label = item_name or name or f"{call_name(call)}.{keyword}"
                found[span[0]] = Embedded(
                    name=label,
                    language=language,
                    start_byte=span[0],
                    end_byte=span[1],
                    start_point=_point(data, span[0]),
                    text=data[span[0] : span[1]].decode(errors="replace"),
                    call=call_name(call),
                    call_start_byte=call.start_byte,
                )
    return sorted(found.values(), key=lambda e: e.start_byte)


@lru_cache(maxsize=4)
def _line_starts(data: bytes) -> list[int]:
    """Byte offset of every line's start; computed once per text, not once per unit."""
    return [0, *(m.end() for m in re.finditer(b"\n", data))]


def _point(data: bytes, offset: int) -> tuple[int, int]:
    starts = _line_starts(data)
    row = bisect.bisect_right(starts, offset) - 1
    return row, offset - starts[row]


def flag_values(python_source: str | bytes, keyword: str) -> list[str]:
    """Every string in the `keyword` flags lists (e.g. "extra_cflags") of loader calls."""
    tree = parse(python_source, "python")
    assignments = module_assignments(tree.root_node)
    flags: list[str] = []
    for call in loader_calls(tree):
        position = 2 if call_name(call) == "load_cpp" and keyword == "extra_cflags" else None
        value = call_argument(call, keyword, position)
        if value is None:
            continue
        _, node = resolve(value, assignments)
        flags += [text(s)[1:-1] for s in node.named_children if s.type == "string"]
    return flags
