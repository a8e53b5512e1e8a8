"""Small, conservative static analyses of C++/CUDA trees that decide applicability."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies.base import mentions

EXITS = ("return_statement", "break_statement", "goto_statement")


def write_targets(node: Node) -> list[tuple[Node, str]]:
    """(target, operator) of every assignment / ++ / -- under `node`."""
    found = []
    for n in walk(node):
        if n.type == "assignment_expression":
            left, op = n.child_by_field_name("left"), n.child_by_field_name("operator")
            if left is not None:
                found.append((left, text(op)))
        elif n.type == "update_expression":
            argument = n.child_by_field_name("argument")
            if argument is not None:
                found.append((argument, "++"))
    return found


def declared_names(node: Node) -> dict[str, Node]:
    """Variables declared under `node` -> the declarator holding their initializer."""
    found: dict[str, Node] = {}
    for n in walk(node):
        if n.type == "init_declarator":
            inner = n.child_by_field_name("declarator")
            while inner is not None and inner.type != "identifier":
                inner = inner.child_by_field_name("declarator")
            if inner is not None:
                found[text(inner)] = n
    return found


@dataclass(frozen=True)
class Loop:
    """A canonical counted loop: `for (T v = START; v < BOUND; ++v / v += STEP)`."""

    node: Node
    var: str
    type: str
    start: Node
    bound: Node
    unit_step: bool


def canonical(loop: Node) -> Loop | None:
    if loop.type != "for_statement":
        return None
    init = loop.child_by_field_name("initializer")
    cond = loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    if init is None or init.type != "declaration" or cond is None or update is None:
        return None
    declarators = [d for d in init.named_children if d.type == "init_declarator"]
    if len(declarators) != 1 or cond.type != "binary_expression":
        return None
    var = text(declarators[0].child_by_field_name("declarator"))
    start = declarators[0].child_by_field_name("value")
    bound = cond.child_by_field_name("right")
    if start is None or bound is None or text(cond.child_by_field_name("left")) != var:
        return None
    if text(cond.child_by_field_name("operator")) not in ("<", "<="):
        return None
    unit = re.fullmatch(rf"(\+\+\s*{var}|{var}\s*\+\+|{var}\s*\+=\s*1)", text(update))
    stepping = re.fullmatch(rf"{var}\s*\+=\s*\w+", text(update))
    if not (unit or stepping):
        return None
    kind = text(init.child_by_field_name("type"))
    return Loop(loop, var, kind, start, bound, unit is not None)


def derived_names(loop: Loop) -> set[str]:
    """The loop variable and every variable declared in the loop whose initializer (or,
    for inner loops, start) depends on it: the data each iteration owns."""
    declared = declared_names(loop.node.child_by_field_name("body") or loop.node)
    derived = {loop.var}
    changed = True
    while changed:
        changed = False
        for name, decl in declared.items():
            value = decl.child_by_field_name("value")
            if name not in derived and value is not None and mentions(value, derived):
                derived.add(name)
                changed = True
    return derived


def carried_reason(loop: Loop, reductions: dict[str, str] | None = None) -> str | None:
    """Why iterations of `loop` may depend on each other, or None when they look
    independent. Outer scalars only reduced (`s += e`, `s *= e`, `m = a > m ? a : m`,
    `m = fmaxf(m, a)`) are added to `reductions` (name -> OpenMP operator) when a dict is
    given (they become reduction clauses)."""
    body = loop.node.child_by_field_name("body")
    if body is None:
        return "a loop without a body"
    if any(n.type in EXITS for n in walk(body)):
        return "the loop exits early"
    local = set(declared_names(body))
    derived = derived_names(loop)
    for target, op in write_targets(body):
        if target.type == "identifier":
            name = text(target)
            if name in local:
                continue
            operator = reduction_operator(body, target, op)
            if reductions is not None and operator is not None:
                reductions[name] = operator
                continue
            return f"the loop updates the outer variable {name!r}"
        if target.type != "subscript_expression" or not mentions(target, derived):
            return f"the write to {text(target)!r} does not depend on {loop.var!r}"
        if _other_index(body, target):
            array = text(target.child_by_field_name("argument"))
            return f"the loop reads {array!r} at another index than it writes"
    return None


MAX_CALLS = {"fmaxf": "max", "fmax": "max", "std::max": "max", "max": "max"}
MIN_CALLS = {"fminf": "min", "fmin": "min", "std::min": "min", "min": "min"}


def reduction_operator(body: Node, target: Node, op: str) -> str | None:
    """The OpenMP reduction operator when `target` (an outer scalar) is touched only by
    its one update under `body`, which reduces it; else None."""
    name = text(target)
    uses = [n for n in walk(body) if n.type == "identifier" and text(n) == name]
    update = target.parent
    if update is None or update.type != "assignment_expression":
        return None
    right = strip_parens(update.child_by_field_name("right"))
    if right is None or not all(within(u, update) for u in uses):
        return None
    if op in ("+=", "*=", "-="):
        return None if mentions(right, {name}) else {"+=": "+", "-=": "+", "*=": "*"}[op]
    if op != "=":
        return None
    return select_operator(right, name)


def select_operator(right: Node, name: str) -> str | None:
    """`max`/`min` for `a > m ? a : m`-like selects and fmaxf/std::max calls on `name`."""
    if right.type == "call_expression":
        called = text(right.child_by_field_name("function"))
        args = right.child_by_field_name("arguments")
        operands = [text(a) for a in args.named_children] if args is not None else []
        kind = MAX_CALLS.get(called) or MIN_CALLS.get(called)
        if kind is None or len(operands) != 2 or operands.count(name) != 1:
            return None
        value = [a for a in args.named_children if text(a) != name] if args else []
        return kind if value and not mentions(value[0], {name}) else None
    if right.type != "conditional_expression":
        return None
    cond = strip_parens(right.child_by_field_name("condition"))
    chosen = strip_parens(right.child_by_field_name("consequence"))
    rejected = strip_parens(right.child_by_field_name("alternative"))
    if cond is None or cond.type != "binary_expression" or chosen is None or rejected is None:
        return None
    left, rhs = (
        strip_parens(cond.child_by_field_name("left")),
        strip_parens(cond.child_by_field_name("right")),
    )
    compare = text(cond.child_by_field_name("operator"))
    if left is None or rhs is None or {text(left), text(rhs)} != {text(chosen), text(rejected)}:
        return None
    if name not in (text(left), text(rhs)) or text(left) == text(rhs):
        return None
    if mentions(rhs if text(left) == name else left, {name}):
        return None
    if compare not in (">", ">=", "<", "<="):
        return None
    greater = compare in (">", ">=")
    picks_left = text(chosen) == text(left)
    return "max" if greater == picks_left else "min"


def strip_parens(node: Node | None) -> Node | None:
    while node is not None and node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[0]
    return node


def within(node: Node, ancestor: Node) -> bool:
    """True when `node` lies inside `ancestor` (or is it)."""
    return ancestor.start_byte <= node.start_byte and node.end_byte <= ancestor.end_byte


def _other_index(body: Node, target: Node) -> bool:
    """True when the array written by `target` is also accessed at a different index."""
    array = text(target.child_by_field_name("argument"))
    return any(
        n.type == "subscript_expression"
        and text(n.child_by_field_name("argument")) == array
        and text(n.child_by_field_name("indices")) != text(target.child_by_field_name("indices"))
        for n in walk(body)
    )


def in_compound(node: Node) -> bool:
    return node.parent is not None and node.parent.type == "compound_statement"


@dataclass(frozen=True)
class Guard:
    """`T i = <thread index>; if (i < BOUND) BODY` closing a kernel: one thread per item."""

    declaration: Node
    branch: Node
    var: str
    type: str
    index: Node
    bound: Node
    body: Node


def thread_guard(kernel: Node) -> Guard | str:
    body = kernel.child_by_field_name("body")
    statements = [s for s in body.named_children if s.type != "comment"] if body else []
    if len(statements) < 2:
        return "the kernel has no `if (i < n)` per-thread guard"
    decl, branch = statements[-2], statements[-1]
    declarators = [d for d in decl.named_children if d.type == "init_declarator"]
    if decl.type != "declaration" or branch.type != "if_statement" or len(declarators) != 1:
        return "the kernel does not end in `int i = ...; if (i < n) {...}`"
    var = text(declarators[0].child_by_field_name("declarator"))
    index = declarators[0].child_by_field_name("value")
    cond = branch.child_by_field_name("condition")
    test = cond.named_children[0] if cond is not None and cond.named_children else None
    consequence = branch.child_by_field_name("consequence")
    if index is None or "threadIdx" not in text(index) or test is None or consequence is None:
        return "the per-thread index is not computed from threadIdx"
    if test.type != "binary_expression" or text(test.child_by_field_name("left")) != var:
        return f"the guard is not `{var} < n`"
    if text(test.child_by_field_name("operator")) != "<" or branch.child_by_field_name(
        "alternative"
    ):
        return f"the guard is not a plain `if ({var} < n)`"
    if any(n.type in EXITS for n in walk(consequence)) or "__syncthreads" in text(consequence):
        return "the guarded body returns or synchronises"
    if any(text(t) == var for t, _ in write_targets(consequence)):
        return f"the guarded body changes {var!r}"
    kind = text(decl.child_by_field_name("type"))
    bound = test.child_by_field_name("right")
    assert bound is not None
    return Guard(decl, branch, var, kind, index, bound, consequence)


def kernels(root: Node) -> list[Node]:
    return [fn for fn in cxx_source.functions(root) if cxx_source.is_global(fn)]


def reduction_clauses(reductions: dict[str, str]) -> str:
    """` reduction(+:s) reduction(max:m)` for a carried_reason reductions dict."""
    return "".join(f" reduction({op}:{name})" for name, op in sorted(reductions.items()))


# libm functions with a libmvec variant in glibc >= 2.35 (x86-64: SSE/AVX2/AVX-512)
_VECTOR = [
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cbrt",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "exp",
    "exp10",
    "exp2",
    "expm1",
    "log",
    "log10",
    "log1p",
    "log2",
    "sin",
    "sinh",
    "tan",
    "tanh",
]
VECTOR_MATH = {f"{name}f": "float" for name in _VECTOR} | dict.fromkeys(_VECTOR, "double")


def math_calls(loops: list[Node]) -> list[str]:
    """The libm functions with a vector variant called in `loops`, sorted."""
    found = set()
    for loop in loops:
        for n in walk(loop):
            if n.type == "call_expression":
                name = text(n.child_by_field_name("function"))
                if name in VECTOR_MATH:
                    found.add(name)
    return sorted(found)


def declared_simd(code: str, name: str) -> bool:
    """True when `code` redeclares `name` under `#pragma omp declare simd`."""
    return re.search(rf"declare\s+simd[^\n]*\n\s*\w+\s+{name}\s*\(", code) is not None


def outermost_loops(fn: Node) -> list[Node]:
    every = cxx_source.loops(fn)
    return [loop for loop in every if not any(o != loop and within(loop, o) for o in every)]


def simd_clause(node: Node) -> tuple[str | None, str]:
    """(why the innermost loop `node` cannot take `omp simd`, or None; its reduction clauses)."""
    loop = canonical(node)
    if loop is None or not loop.unit_step or not in_compound(node):
        return "an innermost loop is not a canonical unit-step for loop", ""
    reductions: dict[str, str] = {}
    reason = carried_reason(loop, reductions)
    if reason is not None:
        return reason, ""
    return None, reduction_clauses(reductions)


def substitute(node: Node, names: dict[str, str], swap: tuple[Node, str] | None = None) -> str:
    """`node`'s text with the identifiers in `names` replaced (and the node `swap[0]`
    under it by the text `swap[1]`)."""
    start, pieces, at = node.start_byte, [], node.start_byte
    source = node.text or b""
    for n in walk(node):
        if n.start_byte < at:  # inside what was swapped
            continue
        if swap is not None and n == swap[0]:
            replacement = swap[1]
        elif n.type == "identifier" and text(n) in names:
            replacement = names[text(n)]
        else:
            continue
        pieces.append(source[at - start : n.start_byte - start].decode())
        pieces.append(replacement)
        at = n.end_byte
    pieces.append(source[at - start :].decode())
    return "".join(pieces)


def unit_stride(index: Node, var: str) -> bool:
    """True when `var` enters `index` with coefficient one (`k * N + j`, not `j * K + k`)."""
    for n in walk(index):
        if n.type == "identifier" and text(n) == var:
            parent = n.parent
            while parent is not None and parent != index.parent:
                if parent.type == "binary_expression" and text(
                    parent.child_by_field_name("operator")
                ) not in ("+", "-"):
                    return False
                parent = parent.parent
    return True
