"""Kernel units: the one kernel model the editor and the loop share, with byte ranges in
the file (C++/CUDA functions, Model classes, loader calls, `@triton.jit` functions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tree_sitter import Node, Tree

from htam_engine.parsing.cxx_source import FunctionFacts, function_facts, functions
from htam_engine.parsing.python_source import Embedded, embedded_sources, loader_calls
from htam_engine.parsing.trees import as_bytes, parse, text
from htam_engine.parsing.triton_source import launch_calls, triton_functions, undecorated


@dataclass(frozen=True)
class KernelUnit:
    """A unit of code the editor and the loop work on, with byte ranges in the file.

    kind: "global" (a `__global__` kernel; `launchers` names the host functions that
    launch it), "host" (a host / extern "C" function), "model" (a Model/ModelNew class),
    "module" (a load_inline / load_cpp call), "triton" (a `@triton.jit` function with its
    decorators; `launchers` names the Python functions that launch it). `facts` is set for
    C++/CUDA functions.
    """

    name: str
    kind: str
    language: str
    start_byte: int
    end_byte: int
    name_start: int
    name_end: int
    launchers: tuple[str, ...] = ()
    facts: FunctionFacts | None = field(default=None, compare=False)

    @property
    def is_kernel(self) -> bool:
        """A unit HTAM optimizes: a CUDA or Triton kernel, a Model class or a plain C++ (CPU)
        function."""
        if self.kind == "host":
            return self.language == "cpp"
        return self.kind in ("global", "model", "triton")

    def shifted(self, delta: int) -> KernelUnit:
        """The same unit, `delta` bytes further into the file (an embedded source's place)."""
        return replace(
            self,
            start_byte=self.start_byte + delta,
            end_byte=self.end_byte + delta,
            name_start=self.name_start + delta,
            name_end=self.name_end + delta,
        )


MODEL_CLASSES = ("Model", "ModelNew")  # KernelBench's names


def _cxx_kernels(root: Node, language: str) -> list[KernelUnit]:
    facts = [(fn, function_facts(fn)) for fn in functions(root)]
    launchers: dict[str, list[str]] = {}
    for _fn, f in facts:
        for target in f.launches:
            launchers.setdefault(target, []).append(f.name)
    return [
        KernelUnit(
            f.name,
            "global" if f.is_global else "host",
            language,
            fn.start_byte,
            fn.end_byte,
            fn.start_byte + f.name_span[0],
            fn.start_byte + f.name_span[1],
            tuple(launchers.get(f.name, ())) if f.is_global else (),
            f,
        )
        for fn, f in facts
    ]


def _python_unit(node: Node, kind: str, name_node: Node | None) -> KernelUnit:
    name = text(name_node).rsplit(".", 1)[-1]
    name_end = name_node.end_byte if name_node is not None else node.start_byte
    start, end = node.start_byte, node.end_byte
    return KernelUnit(name, kind, "python", start, end, name_end - len(name.encode()), name_end)


def _enclosing_function(node: Node) -> str | None:
    parent = node.parent
    while parent is not None and parent.type != "function_definition":
        parent = parent.parent
    return None if parent is None else text(parent.child_by_field_name("name"))


def _triton_units(root: Node) -> list[KernelUnit]:
    units = []
    for decorated in triton_functions(root):
        name_node = undecorated(decorated).child_by_field_name("name")
        calls = launch_calls(root, text(name_node))
        launchers = dict.fromkeys(f for c in calls if (f := _enclosing_function(c)))
        unit = _python_unit(decorated, "triton", name_node)
        units.append(replace(unit, launchers=tuple(launchers)))
    return units


EmbeddedTrees = Callable[[Embedded], Tree]


def kernels(
    source: str | bytes,
    language: str,
    tree: Tree | None = None,
    embedded_tree: EmbeddedTrees | None = None,
) -> list[KernelUnit]:
    """Kernel units in document order with byte ranges in `source`: C++/CUDA functions
    (wherever they are declared), or for Python the Model/ModelNew classes, the
    `@triton.jit` functions, the loader calls and the functions of their embedded sources.

    `tree` is `source` already parsed and `embedded_tree` gives an embedded source's tree:
    the language server passes its incrementally maintained ones.
    """
    data = as_bytes(source)
    tree = tree or parse(data, language)
    if language != "python":
        return _cxx_kernels(tree.root_node, language)
    units = [
        _python_unit(node, "model", node.child_by_field_name("name"))
        for node in tree.root_node.children
        if node.type == "class_definition"
        and text(node.child_by_field_name("name")) in MODEL_CLASSES
    ]
    units += [
        _python_unit(call, "module", call.child_by_field_name("function"))
        for call in loader_calls(tree)
    ]
    units += _triton_units(tree.root_node)
    for emb in embedded_sources(data):
        sub = embedded_tree(emb) if embedded_tree else parse(emb.text, emb.language)
        units += [u.shifted(emb.start_byte) for u in _cxx_kernels(sub.root_node, emb.language)]
    return sorted(units, key=lambda u: u.start_byte)
