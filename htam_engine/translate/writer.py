"""Writes the `load_cpp` module of a traced reference: one C++ function per aten op
(a loop nest), a `ModelNew` whose forward allocates each result with torch and calls the
functions in the graph's order.

Sizes are never written into the C++: every function takes its dims as arguments, and
forward passes them from the tensors' shapes at run time. Views, permutes and casts run
in Python as torch layout ops (`view`, `permute(...).contiguous()`, `to`), so every
buffer a function reads is contiguous.
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from htam_engine.translate.trace import Traced

CTYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.bool: "bool",
}
_RESERVED = {
    "out",
    "n",
    "i",
    "j",
    "k",
    "acc",
    "self",
    "torch",
    "ctypes",
    "nn",
    "and",
    "or",
    "not",
    "xor",
    "int",
    "float",
    "double",
    "long",
    "bool",
    "char",
    "auto",
    "new",
    "delete",
    "this",
    "default",
    "case",
    "register",
    "signed",
    "unsigned",
}


class CannotTranslate(Exception):
    """The reference holds an op (or a form of one) the writer cannot yet write."""

    def __init__(self, op: str, why: str = "") -> None:
        super().__init__(
            f"htam cannot yet write a first version for {op}" + (f" ({why})" if why else "")
        )
        self.op = op


@dataclass
class Kernel:
    """One C++ function: its source and the ctypes argument types of its parameters."""

    name: str
    source: str
    argtypes: list[str]


@dataclass
class Writer:
    traced: Traced
    names: dict[str, str] = field(default_factory=dict)  # fx node name -> Python name
    kernels: list[Kernel] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    # -- names and values ---------------------------------------------------------

    def var(self, node: fx.Node) -> str:
        return self.names[node.name]

    def bind(self, node: fx.Node, wanted: str) -> str:
        """A fresh Python (and C) identifier for `node`, close to `wanted`."""
        base = re.sub(r"\W", "_", wanted).strip("_") or "value"
        if base[0].isdigit() or keyword.iskeyword(base) or base in _RESERVED:
            base = f"{base}_"
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        self.names[node.name] = name
        return name

    def line(self, text: str) -> None:
        self.lines.append(text)

    def kernel(self, name: str, params: list[tuple[str, str]], body: list[str]) -> None:
        """A C function `name(params)` with `body` lines; params are (C type, name)."""
        signature = ", ".join(f"{ctype} {pname}" for ctype, pname in params)
        text = "\n".join([f'extern "C" void {name}_forward({signature}) {{', *body, "}"])
        argtypes = [
            "ctypes.c_long"
            if c == "long"
            else "ctypes.c_double"
            if c == "double"
            else "ctypes.c_void_p"
            for c, _ in params
        ]
        self.kernels.append(Kernel(f"{name}_forward", text, argtypes))

    def call(self, name: str, arguments: list[str]) -> None:
        self.line(f"_lib.{name}_forward({', '.join(arguments)})")

    def alloc(self, node: fx.Node, shape: str, index: int | None = None) -> str:
        """`name = torch.empty(shape, dtype)` for `node` (its output `index` when it has
        several); the Python name."""
        value = val(node) if index is None else val(node)[index]
        name = self.bind_output(node, index)
        self.line(f"{name} = torch.empty({shape}, dtype={value.dtype})")
        return name

    def bind_output(self, node: fx.Node, index: int | None) -> str:
        if index is None:
            return self.bind(node, node.name)
        holder = _Part(f"{node.name}_{index}")
        return self.bind(holder, holder.name)  # type: ignore[arg-type]


@dataclass
class _Part:
    """One output of a multi-output op, named until a `getitem` takes it."""

    name: str


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def ctype(node: fx.Node) -> str:
    return ctype_of(val(node))


def ctype_of(value: Any) -> str:
    """The C type of a traced tensor's elements."""
    if value.dtype not in CTYPES:
        raise CannotTranslate("a tensor", f"dtype {value.dtype}")
    return CTYPES[value.dtype]


def literal(value: Any, ctype_: str) -> str:
    """A Python scalar as a C literal of a result of type `ctype_`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "NAN"
        if value in (float("inf"), float("-inf")):
            return "INFINITY" if value > 0 else "-INFINITY"
        text = repr(value)
        text = text if any(c in text for c in ".e") else f"{text}.0"
        return f"{text}f" if ctype_ == "float" else text
    raise CannotTranslate(f"a constant {value!r}")


def py_literal(value: Any) -> str:
    """A Python scalar as Python source (`repr` writes NaN as the undefined name `nan`)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"float({str(value)!r})"
    return repr(value)


def shape_tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


_BARE_INIT = "def __init__(self):\n    super().__init__()"
_IMPORTED = {"import torch", "import torch.nn as nn"}  # the written module's own imports


def init_source(source: str) -> tuple[str, str]:
    """(module-level code the reference's `Model.__init__` may need, that `__init__`
    made `ModelNew`'s): building the same layers in the same order, after the judge's
    seed, gives the same weights."""
    tree = ast.parse(source)
    kept, init = [], None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            init = next(
                (f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None,
            )
        elif not (isinstance(node, ast.FunctionDef) and node.name.startswith("get_")) and (
            ast.unparse(node) not in _IMPORTED
        ):
            kept.append(node)
    written = _SuperRenamer().visit(init or ast.parse(_BARE_INIT))
    prelude = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    return prelude, ast.unparse(written)


class _SuperRenamer(ast.NodeTransformer):
    """`super(Model, self)` -> `super()`: the class is `ModelNew` now."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []
        return node
