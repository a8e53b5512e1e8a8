"""C++/CUDA source: functions, parameters, launches, loops and constants, and the facts of
one function definition (cached by its text)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine.parsing.trees import text, walk

LOOP_TYPES = ("for_statement", "while_statement", "do_statement")


@dataclass(frozen=True)
class FunctionFacts:
    """What one C++/CUDA function definition is, independent of where it sits in the file
    (so it is cached by the function's text and survives edits elsewhere)."""

    name: str
    name_span: tuple[int, int]  # the name's bytes, relative to the function's start
    is_global: bool
    launches: tuple[str, ...]  # kernels it launches with <<<...>>>
    pointers: tuple[str, ...]  # pointer parameters, as written
    unrestricted: tuple[str, ...]  # the pointer parameters without __restrict__
    bounds_checked: bool  # a kernel that indexes by thread compares before it touches memory


def functions(root: Node) -> list[Node]:
    """Function definitions outside any other function: at file scope and inside
    namespaces, `extern "C"` blocks, templates, `#if`/`#ifdef` branches and class bodies."""
    found: list[Node] = []
    stack = list(reversed(root.children))
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            found.append(node)
        else:
            stack.extend(reversed(node.children))
    return found


def function_name_node(fn: Node) -> Node | None:
    declarator = fn.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return None if declarator is None else declarator.child_by_field_name("declarator")


def function_name(fn: Node) -> str:
    """The declared name (`Ops::scale` for an out-of-class method, `kernel` in a template)."""
    return text(function_name_node(fn))


def parameters(fn: Node) -> list[Node]:
    for node in walk(fn):
        if node.type == "parameter_list":
            return [p for p in node.named_children if p.type == "parameter_declaration"]
    return []


def pointer_declarator(param: Node) -> Node | None:
    declarator = param.child_by_field_name("declarator")
    return (
        declarator if declarator is not None and declarator.type == "pointer_declarator" else None
    )


def is_global(fn: Node) -> bool:
    return any(c.type == "__global__" for c in fn.children)


def launches(root: Node) -> list[Node]:
    """CUDA `kernel<<<grid, block>>>(...)` call expressions."""
    return [
        n
        for n in walk(root)
        if n.type == "call_expression" and any(c.type == "kernel_call_syntax" for c in n.children)
    ]


def launch_config(call: Node) -> list[Node]:
    """The expressions between `<<<` and `>>>` (grid, block, ...)."""
    syntax = next(c for c in call.children if c.type == "kernel_call_syntax")
    return list(syntax.named_children)


def loops(node: Node) -> list[Node]:
    return [n for n in walk(node) if n.type in LOOP_TYPES]


def innermost_loops(node: Node) -> list[Node]:
    return [n for n in loops(node) if len(loops(n)) == 1]


def loop_pragma(loop: Node) -> str:
    """The text of the `#pragma` right before `loop`, or ""."""
    previous = loop.prev_named_sibling
    if previous is not None and previous.type == "preproc_call":
        directive = text(previous.child_by_field_name("directive"))
        return text(previous).strip() if directive == "#pragma" else ""
    return ""


def constants(root: Node) -> dict[str, str]:
    """Compile-time integer constants: `#define N 16` and const/constexpr int declarations."""
    found: dict[str, str] = {}
    for node in walk(root):
        if node.type == "preproc_def":
            value = text(node.child_by_field_name("value")).strip()
            if value.isdigit():
                found[text(node.child_by_field_name("name"))] = value
        elif node.type == "declaration" and re.search(r"\b(const|constexpr)\b", text(node)):
            for decl in node.named_children:
                literal = decl.child_by_field_name("value")
                is_number = literal is not None and literal.type == "number_literal"
                if decl.type == "init_declarator" and is_number:
                    found[text(decl.child_by_field_name("declarator"))] = text(literal)
    return found


def is_fixed_trip(loop: Node, known: dict[str, str]) -> bool:
    """A `for` whose bound is a literal or a named compile-time constant."""
    if loop.type != "for_statement":
        return False
    condition = loop.child_by_field_name("condition")
    if condition is None or condition.type != "binary_expression":
        return False
    bound = condition.child_by_field_name("right")
    return bound is not None and (
        bound.type == "number_literal" or (bound.type == "identifier" and text(bound) in known)
    )


def is_blocked(loop: Node) -> bool:
    """A tile loop: steps by more than one and holds a loop that starts at its variable."""
    if loop.type != "for_statement":
        return False
    update = loop.child_by_field_name("update")
    if update is None or update.type != "assignment_expression" or "+=" not in text(update):
        return False
    variable = text(update.child_by_field_name("left"))
    for inner in loops(loop)[1:]:
        init = inner.child_by_field_name("initializer")
        if init is not None and re.search(rf"\b{re.escape(variable)}\b", text(init)):
            return True
    return False


_FACTS: dict[bytes, FunctionFacts] = {}
_FACTS_LIMIT = 50_000
_RESTRICT = re.compile(r"__restrict(__)?\b")
_THREAD_INDEX = re.compile(r"\b(threadIdx|blockIdx)\b")
_COMPARISON = re.compile(r"[<>]=?")


def function_facts(fn: Node) -> FunctionFacts:
    """The facts of one function definition, cached by its exact text: after an edit only
    the edited functions of a 20k-line file are looked at again."""
    key = fn.text or b""
    cached = _FACTS.get(key)
    if cached is None:
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.clear()
        cached = _FACTS[key] = _compute_facts(fn)
    return cached


def _compute_facts(fn: Node) -> FunctionFacts:
    name_node = function_name_node(fn) or fn
    pointers = tuple(text(p) for p in parameters(fn) if pointer_declarator(p) is not None)
    global_ = is_global(fn)
    indexes = _THREAD_INDEX.search(text(fn.child_by_field_name("body"))) is not None
    return FunctionFacts(
        name=function_name(fn),
        name_span=(name_node.start_byte - fn.start_byte, name_node.end_byte - fn.start_byte),
        is_global=global_,
        launches=tuple(text(c.child_by_field_name("function")) for c in launches(fn)),
        pointers=pointers,
        unrestricted=tuple(p for p in pointers if not _RESTRICT.search(p)),
        bounds_checked=not (global_ and indexes) or _has_guard(fn),
    )


def _has_guard(fn: Node) -> bool:
    """An if/loop condition or ternary that compares (the usual `if (i < n)` guard)."""
    for node in walk(fn):
        if node.type in ("if_statement", "while_statement", "for_statement"):
            condition = node.child_by_field_name("condition")
            if condition is not None and _COMPARISON.search(text(condition)):
                return True
        elif node.type == "conditional_expression":
            return True
    return False
