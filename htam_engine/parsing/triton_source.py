"""Triton source: `@triton.jit` functions, their decorators, their launches
`kernel[grid](...)` and the `tl.*` calls in them, and `Kernel`, one kernel with its
launches (what the rewrites edit and the backend checks)."""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Launch:
    """One `kernel[grid](...)` call: its grid expression and keyword arguments."""

    call: Node
    grid: Node
    arguments: Node
    keywords: dict[str, Node]


@dataclass(frozen=True)
class Kernel:
    """A `@triton.jit` function with its parameters and launches in the file."""

    decorated: Node
    name: str
    parameters: Node
    constexprs: tuple[str, ...]
    plain: tuple[str, ...]  # the other parameters, in order
    autotuned: bool
    launches: tuple[Launch, ...]

    def blocks(self, launch: Launch) -> dict[str, int]:
        """The BLOCK constexprs this launch passes as integer literals."""
        return {
            name: int(text(value))
            for name, value in launch.keywords.items()
            if "BLOCK" in name and name in self.constexprs and text(value).isdigit()
        }


def _parameter(node: Node) -> tuple[str, bool]:
    """(name, is constexpr) of one parameter node."""
    if node.type in ("typed_parameter", "typed_default_parameter"):
        name = next((c for c in node.children if c.type == "identifier"), node)
        annotation = text(node.child_by_field_name("type"))
        return text(name), annotation.endswith("constexpr")
    if node.type == "default_parameter":
        return text(node.child_by_field_name("name")), False
    return text(node), False


def _keywords(arguments: Node) -> dict[str, Node]:
    return {
        text(arg.child_by_field_name("name")): value
        for arg in arguments.named_children
        if arg.type == "keyword_argument" and (value := arg.child_by_field_name("value"))
    }


def _launch(call: Node) -> Launch:
    func = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    assert func is not None and arguments is not None
    grid = func.child_by_field_name("subscript") or func
    return Launch(call, grid, arguments, _keywords(arguments))


def kernels(root: Node) -> list[Kernel]:
    """Every `@triton.jit` kernel of a Python tree with its launches."""
    found = []
    for decorated in triton_functions(root):
        definition = decorated.child_by_field_name("definition")
        assert definition is not None
        name = text(definition.child_by_field_name("name"))
        params = definition.child_by_field_name("parameters")
        assert params is not None
        pairs = [_parameter(p) for p in params.named_children if p.type != "comment"]
        found.append(
            Kernel(
                decorated=decorated,
                name=name,
                parameters=params,
                constexprs=tuple(n for n, const in pairs if const),
                plain=tuple(n for n, const in pairs if not const),
                autotuned="triton.autotune" in decorators(decorated),
                launches=tuple(map(_launch, launch_calls(root, name))),
            )
        )
    return found


def grid_code(launch: Launch) -> Node:
    """The grid's code: the expression, or the def / assignment a grid name refers to in
    the launch's scope."""
    if launch.grid.type != "identifier":
        return launch.grid
    scope = launch.call.parent
    while scope is not None and scope.type not in ("function_definition", "module"):
        scope = scope.parent
    for node in walk(scope) if scope is not None else []:
        named = node.child_by_field_name("name" if node.type == "function_definition" else "left")
        if node.type in ("function_definition", "assignment") and text(named) == text(launch.grid):
            return node
    return launch.grid
