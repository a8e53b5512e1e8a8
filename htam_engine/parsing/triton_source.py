"""Triton source: `@triton.jit` functions, their decorators, their launches
`kernel[grid](...)` and the `tl.*` calls in them."""

from __future__ import annotations

import re

from tree_sitter import Node

from htam_engine.parsing.trees import text, walk

TRITON_LANGUAGE = ("tl.", "triton.language.")  # how kernels name triton.language


def decorator_name(decorator: Node) -> str:
    """`triton.jit` for `@triton.jit` and `@triton.jit(debug=True)` alike."""
    expression = decorator.named_children[0] if decorator.named_children else decorator
    if expression.type == "call":
        expression = expression.child_by_field_name("function") or expression
    return text(expression)


def _imports_jit_from_triton(root: Node) -> bool:
    return any(
        n.type == "import_from_statement"
        and text(n.child_by_field_name("module_name")) == "triton"
        and re.search(r"\bjit\b", text(n)) is not None
        for n in root.children
    )


def triton_functions(root: Node) -> list[Node]:
    """The decorated definitions that hold a `@triton.jit` (or `@jit` imported from
    triton) function, wherever they are declared."""
    jit_names = {"triton.jit", "jit"} if _imports_jit_from_triton(root) else {"triton.jit"}
    return [
        node
        for node in walk(root)
        if node.type == "decorated_definition"
        and any(c.type == "decorator" and decorator_name(c) in jit_names for c in node.children)
    ]


def decorators(definition: Node) -> list[str]:
    """The names of a decorated definition's decorators, outermost first."""
    return [decorator_name(c) for c in definition.children if c.type == "decorator"]


def undecorated(decorated: Node) -> Node:
    """The function definition under a decorated definition's decorators."""
    return decorated.child_by_field_name("definition") or decorated


def launch_calls(root: Node, name: str) -> list[Node]:
    """Launches `name[grid](...)` of a Triton kernel."""
    return [
        n
        for n in walk(root)
        if n.type == "call"
        and (func := n.child_by_field_name("function")) is not None
        and func.type == "subscript"
        and text(func.child_by_field_name("value")).rsplit(".", 1)[-1] == name
    ]


def tl_calls(root: Node) -> list[tuple[str, Node]]:
    """(name, call) for every `tl.NAME(...)` / `triton.language.NAME(...)` call."""
    found = []
    for node in walk(root):
        if node.type == "call":
            callee = text(node.child_by_field_name("function"))
            prefix = next((p for p in TRITON_LANGUAGE if callee.startswith(p)), None)
            if prefix is not None:
                found.append((callee[len(prefix) :], node))
    return found
