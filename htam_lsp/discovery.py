"""Kernel units of an open document, for symbols, lenses, hover and actions.

C++/CUDA files are read from the document's incrementally maintained tree, one top-level
function at a time, with each function's facts cached by its text: after an edit only
the edited functions are looked at again, which keeps requests on a 20k-line file fast.
Python files (KernelBench tasks with `load_inline` sources) go through
`htam_engine.parsing.kernels`, which maps embedded sources back to file bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from tree_sitter import Node

from htam_engine import parsing
from htam_lsp.documents import Document

# Containers whose body holds more file-scope declarations.
_CONTAINERS = ("linkage_specification", "namespace_definition", "declaration_list")
MODEL_CLASSES = ("Model", "ModelNew")  # KernelBench's names
_COMPARISON = re.compile(r"[<>]=?")
_INDEX = re.compile(r"\b(threadIdx|blockIdx)\b")
_RESTRICT = re.compile(r"__restrict(__)?\b")


@dataclass(frozen=True)
class Hint:
    """A static observation about one kernel, shown as a diagnostic."""

    start_byte: int
    end_byte: int
    message: str
    code: str


@dataclass(frozen=True)
class FunctionFacts:
    """What one C++/CUDA function is, independent of where it sits in the file."""

    name: str
    is_global: bool
    launches: tuple[str, ...]
    unrestricted: tuple[str, ...]  # pointer parameters without __restrict__
    bounds_checked: bool


@dataclass(frozen=True)
class Unit:
    """A kernel unit: kind is "global", "host", "model" or "module" (parsing's kinds)."""

    name: str
    kind: str
    language: str
    start_byte: int
    end_byte: int
    name_start: int
    name_end: int
    launchers: tuple[str, ...] = ()
    hints: tuple[Hint, ...] = field(default=(), compare=False)

    @property
    def is_kernel(self) -> bool:
        """A unit HTAM optimizes: a CUDA kernel, a Model class or a plain C++ (CPU) function."""
        return self.kind in ("global", "model") or (self.kind == "host" and self.language == "cpp")


_FACTS: dict[bytes, FunctionFacts] = {}
_FACTS_LIMIT = 50_000


def units(doc: Document) -> list[Unit]:
    """The document's kernel units in document order (cached per document version)."""
    cached = doc.cache.get("units")
    if cached is None:
        cached = _discover(doc)
        doc.cache["units"] = cached
    return cached


def unit_at(doc: Document, offset: int) -> Unit | None:
    """The innermost kernel unit around a byte offset; else the document's model class,
    else its first kernel (commands sent without a position act on the whole task)."""
    around = kernel_around(doc, offset)
    if around is not None:
        return around
    kernels = [u for u in units(doc) if u.is_kernel]
    candidates = [u for u in kernels if u.kind == "model"] or kernels
    return candidates[0] if candidates else None


def kernel_around(doc: Document, offset: int) -> Unit | None:
    """The innermost kernel unit whose range holds the byte offset, if any."""
    around = [u for u in units(doc) if u.is_kernel and u.start_byte <= offset <= u.end_byte]
    return min(around, key=lambda u: u.end_byte - u.start_byte) if around else None


def _discover(doc: Document) -> list[Unit]:
    if doc.tree is None or doc.language is None:
        return []
    if doc.language == "python":
        return _python_units(doc)
    return _cxx_units(doc.tree.root_node, doc.language)


def _python_units(doc: Document) -> list[Unit]:
    """Model classes and loader calls from the document's own (incremental) tree, and the
    functions of each embedded C++/CUDA source, shifted to the literal's place."""
    assert doc.tree is not None
    root = doc.tree.root_node
    found = [
        _node_unit(node, "model", node.child_by_field_name("name"))
        for node in root.children
        if node.type == "class_definition"
        and parsing.text(node.child_by_field_name("name")) in MODEL_CLASSES
    ]
    found += [
        _node_unit(call, "module", call.child_by_field_name("function"))
        for call in parsing.loader_calls(doc.tree)
    ]
    for embedded in parsing.embedded_sources(doc.source):
        tree = doc.embedded_tree(embedded.start_byte, embedded.end_byte, embedded.language)
        found += [
            _shift(unit, embedded.start_byte)
            for unit in _cxx_units(tree.root_node, embedded.language)
        ]
    return sorted(found, key=lambda u: u.start_byte)


def _node_unit(node: Node, kind: str, name_node: Node | None) -> Unit:
    name = parsing.text(name_node).rsplit(".", 1)[-1]
    name_end = name_node.end_byte if name_node is not None else node.start_byte
    return Unit(
        name,
        kind,
        "python",
        node.start_byte,
        node.end_byte,
        name_end - len(name.encode()),
        name_end,
    )


def _shift(unit: Unit, delta: int) -> Unit:
    return replace(
        unit,
        start_byte=unit.start_byte + delta,
        end_byte=unit.end_byte + delta,
        name_start=unit.name_start + delta,
        name_end=unit.name_end + delta,
        hints=tuple(
            replace(h, start_byte=h.start_byte + delta, end_byte=h.end_byte + delta)
            for h in unit.hints
        ),
    )


def _top_functions(root: Node) -> list[Node]:
    found: list[Node] = []
    stack = list(reversed(root.children))
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            found.append(node)
        elif node.type == "template_declaration" or node.type in _CONTAINERS:
            body = node.child_by_field_name("body")
            if body is not None and body.type == "function_definition":
                stack.append(body)  # extern "C" void f() {...}
            else:
                stack.extend(reversed((body or node).children))
    return found


def _cxx_units(root: Node, language: str) -> list[Unit]:
    functions = [(fn, facts(fn)) for fn in _top_functions(root)]
    launchers: dict[str, list[str]] = {}
    for _fn, f in functions:
        for target in f.launches:
            launchers.setdefault(target, []).append(f.name)
    found = []
    for fn, f in functions:
        name_node = _name_node(fn) or fn
        start, end = name_node.start_byte, name_node.end_byte
        found.append(
            Unit(
                f.name,
                "global" if f.is_global else "host",
                language,
                fn.start_byte,
                fn.end_byte,
                start,
                end,
                tuple(launchers.get(f.name, ())) if f.is_global else (),
                _hints(f, start, end),
            )
        )
    return found


def _name_node(fn: Node) -> Node | None:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return declarator.child_by_field_name("declarator") if declarator is not None else None


def facts(fn: Node) -> FunctionFacts:
    """The facts of one function definition, cached by its exact text."""
    key = fn.text or b""
    cached = _FACTS.get(key)
    if cached is None:
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.clear()
        cached = _FACTS[key] = _compute_facts(fn)
    return cached


def _compute_facts(fn: Node) -> FunctionFacts:
    is_global = parsing.is_global(fn)
    pointers = [p for p in parsing.parameters(fn) if parsing.pointer_declarator(p) is not None]
    unrestricted = tuple(parsing.text(p) for p in pointers if not _RESTRICT.search(parsing.text(p)))
    body = parsing.text(fn.child_by_field_name("body"))
    return FunctionFacts(
        name=parsing.function_name(fn),
        is_global=is_global,
        launches=tuple(
            parsing.text(c.child_by_field_name("function")) for c in parsing.launches(fn)
        ),
        unrestricted=unrestricted if is_global else (),
        bounds_checked=not is_global or not _INDEX.search(body) or _has_guard(fn),
    )


def _has_guard(fn: Node) -> bool:
    """An if/loop condition or ternary that compares (the usual `if (i < n)` guard)."""
    for node in parsing.walk(fn):
        if node.type in ("if_statement", "while_statement", "for_statement"):
            condition = node.child_by_field_name("condition")
            if condition is not None and _COMPARISON.search(parsing.text(condition)):
                return True
        elif node.type == "conditional_expression":
            return True
    return False


def _hints(f: FunctionFacts, start: int, end: int) -> tuple[Hint, ...]:
    hints = []
    if f.unrestricted:
        hints.append(
            Hint(
                start,
                end,
                f"{f.name}: pointer parameters without __restrict__ "
                f"({', '.join(f.unrestricted)}); if they never alias, __restrict__ lets the "
                "compiler cache loads (HTAM strategy cuda.restrict_const)",
                "no_restrict",
            )
        )
    if not f.bounds_checked:
        hints.append(
            Hint(
                start,
                end,
                f"{f.name}: indexes with threadIdx/blockIdx but has no bounds check "
                "(e.g. `if (i < n)`); the last block may read or write out of range",
                "no_bounds_check",
            )
        )
    return tuple(hints)
