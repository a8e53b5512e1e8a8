"""The rewrite machinery: byte edits planned on tree-sitter trees, applied to a whole file.

A candidate file is either a Python file whose C++/CUDA lives in string literals passed
to `load_inline` / `load_cpp` (rewrites edit those literals and the flags lists), or a raw
`.cu` / `.cpp` file. Every rewrite is a planner that returns the edits it would make or,
when it cannot apply, a short reason; `check` and `apply` share that one plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import python_source, text

LOW_OPT = {"-O0", "-O1", "-O2", "-Os", "-Og"}  # optimization levels a rewrite replaces by -O3
Edit = tuple[int, int, str]  # (start byte, end byte, replacement) in the file's bytes
Plan = list[Edit] | str  # edits, or why the rewrite does not apply
Planner = Callable[[bytes], Plan]  # a whole file's bytes -> plan
CodePlanner = Callable[[bytes, Node], Plan]  # (C++/CUDA source bytes, root) -> plan


class NotApplicable(ValueError):
    """`apply` was called on a source the rewrite does not apply to."""


@dataclass(frozen=True)
class Param:
    """A number a rewrite writes into the code (an unroll factor, a tile or block size,
    accumulators), the values an autotuning step tries, `default` first."""

    name: str
    default: int
    values: tuple[int, ...]

    def tried(self) -> tuple[int, ...]:
        """The values in the order an autotuning step measures them: the default first."""
        return (self.default, *(v for v in self.values if v != self.default))


@dataclass(frozen=True)
class Rewrite:
    """A deterministic mechanical strategy, named by `id` in the seed memory."""

    id: str
    backend: str  # "cuda" | "cpu"
    description: str
    planner: Callable[[bytes], Plan]
    # bundles edits that only pay together (code and the flags it needs): among strategies
    # the memory scores equally, a compound is tried first (one step reaches what the
    # single edits, each refused alone, never do)
    compound: bool = False
    # a parameter of the rewrite and the planner for each of its values (`planner` is the
    # default's): an autotuning step measures the variants and keeps the fastest
    param: Param | None = None
    tuned: Callable[[int], Planner] | None = None

    def check(self, source: str) -> str | None:
        """None when the rewrite applies to `source`, else a short reason why not."""
        plan = self.planner(source.encode())
        return plan if isinstance(plan, str) else None

    def apply(self, source: str) -> str:
        """The rewritten source; raises NotApplicable with the reason when it does not apply."""
        plan = self.planner(source.encode())
        if isinstance(plan, str):
            raise NotApplicable(f"{self.id}: {plan}")
        return apply_edits(source.encode(), plan).decode()

    def variants(self, source: str) -> list[tuple[int, str]]:
        """(value, rewritten source) for each value of the parameter, the default first,
        distinct sources only; [] for a rewrite without one or that does not apply."""
        if self.param is None or self.tuned is None or self.check(source) is not None:
            return []
        found: dict[str, int] = {}
        for value in self.param.tried():
            plan = self.tuned(value)(source.encode())
            if not isinstance(plan, str):
                found.setdefault(apply_edits(source.encode(), plan).decode(), value)
        return [(value, code) for code, value in found.items()]


def tunable(
    rewrite_id: str,
    backend: str,
    description: str,
    param: Param,
    tuned: Callable[[int], Planner],
    compound: bool = False,
) -> Rewrite:
    """A rewrite whose `param` an autotuning step tries (`tuned(value)` plans with it)."""
    return Rewrite(rewrite_id, backend, description, tuned(param.default), compound, param, tuned)


def apply_edits(data: bytes, edits: list[Edit]) -> bytes:
    """Apply non-overlapping edits; insertions at one point keep their listed order."""
    ordered = sorted(enumerate(edits), key=lambda item: (item[1][0], item[0]), reverse=True)
    for _, (start, end, replacement) in ordered:
        data = data[:start] + replacement.encode() + data[end:]
    return data


def code_plan(data: bytes, language: str, planner: CodePlanner) -> Plan:
    """Run `planner` on each embedded source of `language` (or on the raw file) and map
    its edits to file offsets. Applies when any source yields edits."""
    embedded = parsing.embedded_sources(data)
    if not embedded:
        return planner(data, parsing.parse(data, language).root_node)
    edits: list[Edit] = []
    reasons: list[str] = []
    for emb in embedded:
        if emb.language != language:
            continue
        code = emb.text.encode()
        plan = planner(code, parsing.parse(code, language).root_node)
        if isinstance(plan, str):
            reasons.append(plan)
        else:
            edits += [(s + emb.start_byte, e + emb.start_byte, r) for s, e, r in plan]
    if edits:
        return edits
    return reasons[0] if reasons else f"no embedded {language} source"


def cpp(planner: CodePlanner) -> Callable[[bytes], Plan]:
    """`planner` run on every embedded C++ source of a file (or on a raw `.cpp`)."""
    return lambda data: code_plan(data, "cpp", planner)


def _quote(flag: str) -> str:
    return f'"{flag}"'


def flag_plan(data: bytes, keyword: str, add: list[str], remove: set[str]) -> Plan:
    """Edits that add `add` to and drop `remove` from the `keyword` flags list of every
    loader call; a raw source has no flags list."""
    if not parsing.embedded_sources(data):
        return f"a raw source has no {keyword} list (flags belong to its binding)"
    tree = parsing.parse(data, "python")
    assignments = python_source.module_assignments(tree.root_node)
    edits: list[Edit] = []
    for call in python_source.loader_calls(tree):
        cuda = python_source.call_argument(call, "cuda_sources")
        if keyword == "extra_cuda_cflags" and cuda is None:
            continue
        plan = _call_flag_edit(call, keyword, add, remove, assignments)
        if isinstance(plan, str):
            return plan
        edits += plan
    return edits or f"the {keyword} lists already hold {' '.join(add)}"


def _call_flag_edit(
    call: Node, keyword: str, add: list[str], remove: set[str], assignments: dict[str, Node]
) -> Plan:
    position = 2 if python_source.call_name(call) == "load_cpp" else None
    value = python_source.call_argument(call, keyword, position)
    if value is None:
        args = call.child_by_field_name("arguments")
        last = args.named_children[-1] if args is not None and args.named_children else None
        if last is None:
            return "a loader call without arguments"
        new = ", ".join(map(_quote, add))
        return [(last.end_byte, last.end_byte, f", {keyword}=[{new}]")]
    _, value = python_source.resolve(value, assignments)
    if value.type not in ("list", "tuple"):
        return f"{keyword} is not a literal list"
    items = value.named_children
    strings = {text(i)[1:-1] for i in items if i.type == "string"}
    if not set(add) - strings and not strings & remove:
        return []
    kept = [text(i) for i in items if not (i.type == "string" and text(i)[1:-1] in remove)]
    kept += [_quote(f) for f in add if f not in strings]
    return [(value.start_byte, value.end_byte, "[" + ", ".join(kept) + "]")]


def mentions(node: Node, names: set[str]) -> bool:
    """True when an identifier under `node` is one of `names`."""
    return any(n.type == "identifier" and text(n) in names for n in parsing.walk(node))


def indent_of(data: bytes, node: Node) -> str:
    """The whitespace between the start of `node`'s line and `node`."""
    line_start = data.rfind(b"\n", 0, node.start_byte) + 1
    prefix = data[line_start : node.start_byte].decode()
    return prefix if not prefix.strip() else re.sub(r"\S.*", "", prefix)


def insert_line_before(data: bytes, node: Node, line: str) -> Edit:
    """An edit putting `line` on its own line above `node`, at the same indentation."""
    return (node.start_byte, node.start_byte, f"{line}\n{indent_of(data, node)}")
