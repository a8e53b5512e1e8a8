"""CPU rewrites for the arithmetic of a loop: vector math (a compound move), branch-free
selects and division by a reciprocal.

`cpu.vector_math` bundles the edits that only pay together: `-O3 -march=native
-fopenmp-simd -fno-math-errno`, `#pragma omp simd` with sum/max/min reductions on the
innermost loops, and `#pragma omp declare simd` redeclarations of the libm functions those
loops call, so that GCC calls glibc's vector variants from libmvec (`_ZGVdN8v_expf`, ...).
glibc declares them itself only under `-ffast-math`, which would also give up NaN/Inf
semantics; the redeclaration needs neither.
"""

from __future__ import annotations

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.base import (
    LOW_OPT,
    Edit,
    Plan,
    Rewrite,
    apply_edits,
    code_plan,
    cpp,
    flag_plan,
    insert_line_before,
)
from htam_engine.strategies.cpu import _pragma_edit

DEFINITIONS = (
    "function_definition",
    "linkage_specification",
    "namespace_definition",
    "template_declaration",
)
VECTOR_FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno"]


def _simd_loops(root: Node) -> tuple[list[tuple[Node, str]], list[Node], list[str]]:
    """(loop, reduction clause) needing a pragma, loops already vectorised, and why the
    others cannot be."""
    todo: list[tuple[Node, str]] = []
    done: list[Node] = []
    reasons: list[str] = []
    for fn in cxx_source.functions(root):
        for node in cxx_source.innermost_loops(fn):
            pragma = cxx_source.loop_pragma(node)
            if "simd" in pragma:
                done.append(node)
                continue
            reason, clause = analysis.simd_clause(node)
            if reason is not None:
                reasons.append(reason)
                continue
            todo.append((node, clause))
    return todo, done, reasons


def _declarations(code: bytes, root: Node, names: list[str]) -> list[Edit]:
    """`#pragma omp declare simd notinbranch` redeclarations of `names` (those not yet
    declared so), placed before the first definition."""
    names = [n for n in names if not analysis.declared_simd(code.decode(), n)]
    if not names:
        return []
    lines = ['extern "C" {']
    for name in names:
        kind = analysis.VECTOR_MATH[name]
        lines += ["#pragma omp declare simd notinbranch", f"{kind} {name}({kind});"]
    block = "\n".join([*lines, "}", ""])
    # after every header: a redeclaration must follow math.h's, which adds noexcept
    first = next((n for n in root.children if n.type in DEFINITIONS), None)
    at = first.start_byte if first is not None else len(code)
    return [(at, at, block + ("\n" if first is not None else ""))]


def plan_vector_math_code(code: bytes, root: Node) -> Plan:
    todo, done, reasons = _simd_loops(root)
    if not todo and not done:
        return reasons[0] if reasons else "no loop to vectorise"
    merge = "#pragma omp parallel for"
    edits = [_pragma_edit(code, node, "simd", clause, merge) for node, clause in todo]
    edits += _declarations(code, root, analysis.math_calls([n for n, _ in todo] + done))
    return edits or "the innermost loops are already simd with vector math declared"


def plan_vector_math(data: bytes) -> Plan:
    """The compound: branch-free selects (a max kept with `if` is a reduction once it is a
    select), then simd pragmas + libm declarations + flags; applies when any is missing.
    With selects to make, the plan is one edit of the whole file (the two steps' edits
    would overlap)."""
    selects = code_plan(data, "cpp", plan_branchless)
    if isinstance(selects, list) and parsing.embedded_sources(data):
        selected = apply_edits(data, selects)
        rest = _vector_math(selected)
        return (
            rest
            if isinstance(rest, str)
            else [(0, len(data), apply_edits(selected, rest).decode())]
        )
    return _vector_math(data)


def _vector_math(data: bytes) -> Plan:
    if not parsing.embedded_sources(data):
        return "a raw source has no extra_cflags list (vector math needs its flags)"
    code = code_plan(data, "cpp", plan_vector_math_code)
    flags = flag_plan(data, "extra_cflags", VECTOR_FLAGS, LOW_OPT)
    if isinstance(code, str) and isinstance(flags, str):
        return f"{code}; {flags}"
    if isinstance(code, str) and not _has_simd(data):
        return code  # flags alone are cpu.opt_flags' move
    return (code if isinstance(code, list) else []) + (flags if isinstance(flags, list) else [])


def _has_simd(data: bytes) -> bool:
    return "simd_pragma" in parsing.features(data.decode(), "cpu")


# -- branch-free selects --------------------------------------------------------------


def _single_assignment(node: Node | None) -> Node | None:
    """The `x = e` of a statement that is only that assignment (braces allowed)."""
    if node is not None and node.type == "compound_statement":
        inner = [s for s in node.named_children if s.type != "comment"]
        node = inner[0] if len(inner) == 1 else None
    if node is None or node.type != "expression_statement" or not node.named_children:
        return None
    expr = node.named_children[0]
    if expr.type != "assignment_expression":
        return None
    return expr if text(expr.child_by_field_name("operator")) == "=" else None


def _pure(node: Node) -> bool:
    """No assignments or ++/-- (calls are assumed pure: math functions)."""
    return not any(n.type in ("assignment_expression", "update_expression") for n in walk(node))


def _select(branch: Node) -> str | None:
    """`if (c) t = a; else t = b;` -> `t = (c) ? (a) : (b);` (or `: t` for a scalar with
    no else); None when the branch is not of that form."""
    cond = branch.child_by_field_name("condition")
    then = _single_assignment(branch.child_by_field_name("consequence"))
    alternative = branch.child_by_field_name("alternative")
    if cond is None or then is None:
        return None
    target = then.child_by_field_name("left")
    value = then.child_by_field_name("right")
    if target is None or value is None or not _pure(cond) or not _pure(value):
        return None
    if alternative is None:
        if target.type != "identifier":
            return None  # `a[i] = c ? v : a[i]` would add a read and a store
        other = text(target)
    else:
        body = alternative.named_children[-1] if alternative.named_children else None
        otherwise = _single_assignment(body)
        if otherwise is None or text(otherwise.child_by_field_name("left")) != text(target):
            return None
        right = otherwise.child_by_field_name("right")
        if right is None or not _pure(right):
            return None
        other = text(right)
    condition = text(analysis.strip_parens(cond.named_children[0]))
    return f"{text(target)} = ({condition}) ? ({text(value)}) : ({other});"


def plan_branchless(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    for fn in cxx_source.functions(root):
        for loop in cxx_source.innermost_loops(fn):
            for branch in walk(loop):
                if branch.type != "if_statement":
                    continue
                select = _select(branch)
                if select is not None:
                    edits.append((branch.start_byte, branch.end_byte, select))
    return edits or "no if/else in an innermost loop that assigns one value"


# -- division by a reciprocal -----------------------------------------------------------

PURE_CALLS = {"sqrtf", "sqrt", "fabsf", "fabs", *analysis.VECTOR_MATH}


def scalar_types(fn: Node) -> dict[str, str]:
    """Declared type of every plain (non-pointer) variable and parameter of `fn`."""
    types: dict[str, str] = {}
    for n in walk(fn):
        if n.type not in ("parameter_declaration", "declaration"):
            continue
        kind = text(n.child_by_field_name("type"))
        for d in n.named_children:
            inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            if inner is not None and inner.type == "identifier":
                types[text(inner)] = kind
    return types


def _floating(node: Node, types: dict[str, str]) -> str | None:
    """ "float"/"double" when `node` is a floating expression built from floating variables,
    float literals and pure math calls; None when it may be an integer (or is unknown)."""
    kinds = set()
    for n in walk(node):
        if n.type == "call_expression":
            name = text(n.child_by_field_name("function"))
            if name not in PURE_CALLS:
                return None
            kinds.add("float" if name.endswith("f") and name != "erf" else "double")
        elif n.type == "identifier" and not (n.parent and n.parent.type == "call_expression"):
            kind = types.get(text(n), "")
            if kind not in ("float", "double"):
                return None
            kinds.add(kind)
        elif n.type == "number_literal":
            literal = text(n).lower()
            if "." not in literal and "e" not in literal:
                continue  # an integer literal next to floating variables is converted
            kinds.add("float" if literal.endswith("f") else "double")
    return ("double" if "double" in kinds else "float") if kinds else None


def invariant(node: Node, loop: analysis.Loop) -> bool:
    body = loop.node.child_by_field_name("body")
    if body is None:
        return False
    written = {text(t) for t, _ in analysis.write_targets(body) if t.type == "identifier"}
    varying = written | set(analysis.declared_names(body)) | {loop.var}
    return not analysis.mentions(node, varying)


def _inside(node: Node, outer: list[Node]) -> bool:
    return any(o.start_byte <= node.start_byte and node.end_byte <= o.end_byte for o in outer)


def plan_reciprocal(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    for fn in cxx_source.functions(root):
        types = scalar_types(fn)
        taken = {text(n) for n in walk(fn) if n.type == "identifier"}
        for node in cxx_source.innermost_loops(fn):
            loop = analysis.canonical(node)
            if loop is None or not analysis.in_compound(node):
                continue
            names: dict[str, str] = {}
            replaced: list[Node] = []  # divisions rewritten (one inside another is left)
            for n in walk(node):
                right = n.child_by_field_name("right") if n.type == "binary_expression" else None
                if right is None or text(n.child_by_field_name("operator")) != "/":
                    continue
                kind = _floating(right, types)
                if kind is None or not invariant(right, loop) or _inside(n, replaced):
                    continue
                replaced.append(n)
                if text(right) not in names:
                    index = len(edits)
                    while f"rcp{index}" in taken:
                        index += 1
                    names[text(right)] = f"rcp{index}"
                    taken.add(f"rcp{index}")
                    one = "1.0f" if kind == "float" else "1.0"
                    anchor = node.prev_named_sibling if cxx_source.loop_pragma(node) else node
                    assert anchor is not None
                    line = f"const {kind} {names[text(right)]} = {one} / ({text(right)});"
                    edits.append(insert_line_before(code, anchor, line))
                left = n.child_by_field_name("left")
                assert left is not None
                edits.append((n.start_byte, n.end_byte, f"{text(left)} * {names[text(right)]}"))
    return edits or "no inner-loop division by a loop-invariant floating value"


REWRITES = [
    Rewrite(
        "cpu.vector_math",
        "cpu",
        "branch-free selects, omp simd (+/max/min reductions) on inner loops, libmvec vector math "
        "(declare simd), -O3 -march=native -fopenmp-simd -fno-math-errno",
        plan_vector_math,
        compound=True,
    ),
    Rewrite(
        "cpu.branchless",
        "cpu",
        "if/else assigning one value in an inner loop -> a conditional select",
        cpp(plan_branchless),
    ),
    Rewrite(
        "cpu.reciprocal",
        "cpu",
        "divisions by a loop-invariant floating value in an inner loop -> one reciprocal "
        "before the loop and multiplications",
        cpp(plan_reciprocal),
    ),
]
