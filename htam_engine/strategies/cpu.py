"""Mechanical C++ (CPU) rewrites: OpenMP threads and SIMD, compiler flags, restrict,
cache blocking."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import cxx_source, python_source, text
from htam_engine.strategies import analysis, cpu_matmul
from htam_engine.strategies.base import (
    LOW_OPT,
    CodePlanner,
    Edit,
    Param,
    Plan,
    Rewrite,
    code_plan,
    cpp,
    flag_plan,
    indent_of,
    insert_line_before,
    tunable,
)
from htam_engine.strategies.cuda import pointer_qualifier_edits

TILE = Param("tile", 64, (32, 64, 128))  # the cache block's edge, in elements


def _pragma_edit(code: bytes, loop: Node, own: str, extra: str, merge_with: str) -> Edit:
    """Insert `#pragma omp <own><extra>` above `loop`, or merge into a `merge_with` pragma
    already there (`omp parallel for` + `omp simd` -> `omp parallel for simd`). A `GCC
    unroll` pragma is replaced: GCC allows no pragma between it and an omp one, and the
    vectorizer unrolls the loop itself."""
    existing = cxx_source.loop_pragma(loop)
    previous = loop.prev_named_sibling
    if existing.startswith(merge_with) and previous is not None:
        merged = "#pragma omp parallel for simd" + existing[len(merge_with) :] + extra
        return (previous.start_byte, previous.end_byte, merged + "\n")
    if existing.startswith("#pragma GCC unroll") and previous is not None:
        return (previous.start_byte, previous.end_byte, f"#pragma omp {own}{extra}\n")
    return insert_line_before(code, loop, f"#pragma omp {own}{extra}")


def plan_parallel_for(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons = []
    for fn in cxx_source.functions(root):
        for node in analysis.outermost_loops(fn):
            loop = analysis.canonical(node)
            pragma = cxx_source.loop_pragma(node)
            reason = _parallel_reason(node, loop, pragma)
            if reason is not None:
                reasons.append(reason)
                continue
            edits.append(_pragma_edit(code, node, "parallel for", "", "#pragma omp simd"))
    return edits or (reasons[0] if reasons else "no loop to parallelise")


def _parallel_reason(node: Node, loop: analysis.Loop | None, pragma: str) -> str | None:
    if "parallel" in pragma:
        return "the outermost loop is already parallel"
    if loop is None or not analysis.in_compound(node):
        return "the outermost loop is not a canonical counted for loop"
    return analysis.carried_reason(loop)


def plan_simd(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons = []
    scalar = _scalar_math(code, root)
    if scalar is not None:
        return scalar
    for fn in cxx_source.functions(root):
        for node in cxx_source.innermost_loops(fn):
            pragma = cxx_source.loop_pragma(node)
            if "simd" in pragma or "#pragma GCC ivdep" in pragma:
                reasons.append("the innermost loops already have a simd pragma")
                continue
            reason, clause = analysis.simd_clause(node)
            if reason is not None:
                reasons.append(reason)
                continue
            edits.append(_pragma_edit(code, node, "simd", clause, "#pragma omp parallel for"))
    return edits or (reasons[0] if reasons else "no loop to vectorise")


def _scalar_math(code: bytes, root: Node) -> str | None:
    """Why a simd pragma alone is the lesser move: an inner loop calls libm without its
    vector variants declared, which cpu.vector_math does along with the pragmas."""
    inner = [loop for fn in cxx_source.functions(root) for loop in cxx_source.innermost_loops(fn)]
    calls = analysis.math_calls(inner)
    missing = [name for name in calls if not analysis.declared_simd(code.decode(), name)]
    if missing:
        names = ", ".join(missing)
        return f"an inner loop calls {names} with no vector variant declared (vector math)"
    return None


def plan_restrict(code: bytes, root: Node) -> Plan:
    fns = cxx_source.functions(root)
    edits = [e for fn in fns for e in pointer_qualifier_edits(fn, const=False)]
    return edits or "every pointer parameter is already __restrict__"


def _perfect_child(loop: analysis.Loop) -> Node | None:
    body = loop.node.child_by_field_name("body")
    if body is not None and body.type == "compound_statement":
        statements = [s for s in body.named_children if s.type != "comment"]
        return statements[0] if len(statements) == 1 else None
    return body


def _nest(node: Node) -> list[analysis.Loop] | None:
    """Three perfectly nested unit-step loops from 0 ending in one `target += ...`."""
    loops: list[analysis.Loop] = []
    current: Node | None = node
    while current is not None and current.type == "for_statement" and len(loops) < 3:
        loop = analysis.canonical(current)
        if loop is None or not loop.unit_step or text(loop.start) != "0":
            return None
        loops.append(loop)
        current = _perfect_child(loop)
    if len(loops) != 3 or current is None or current.type != "expression_statement":
        return None
    update = current.named_children[0] if current.named_children else None
    if update is None or update.type != "assignment_expression":
        return None
    target = update.child_by_field_name("left")
    if text(update.child_by_field_name("operator")) != "+=" or target is None:
        return None
    outer, middle, inner = (loop.var for loop in loops)
    if analysis.mentions(target, {inner}) or not analysis.mentions(target, {outer, middle}):
        return None
    return loops


def plan_cache_block(code: bytes, root: Node, tile: int = TILE.default) -> Plan:
    edits: list[Edit] = []
    for fn in cxx_source.functions(root):
        for node in analysis.outermost_loops(fn):
            loops = _nest(node)
            if loops is not None and cpu_matmul.reorders(code, node):
                return "the nest's loop order does not match its layout: reorder it first"
            if loops is not None:
                edits.append((node.start_byte, node.end_byte, _tiled(code, node, loops, tile)))
    if edits:
        return edits
    if "blocked_loops" in parsing.features(code, "cpu"):
        return "the loop nest is already blocked"
    return "no perfectly nested i/j/k loop nest accumulating with +="


def _tiled(code: bytes, node: Node, loops: list[analysis.Loop], tile: int) -> str:
    """Tile loops (i, j, k) then the point loops in (i, k, j) order: for each (i, j) the
    k sum keeps its order, and the innermost loop walks the output row."""
    pad = indent_of(code, node)
    statement = _perfect_child(loops[2])
    assert statement is not None
    lines = []
    for depth, loop in enumerate(loops):
        bound = text(loop.bound)
        lines.append(
            f"{pad}{'    ' * depth}for ({loop.type} {loop.var}_blk = 0; {loop.var}_blk < {bound};"
            f" {loop.var}_blk += {tile}) {{"
        )
    for depth, loop in enumerate((loops[0], loops[2], loops[1]), start=3):
        v, bound = loop.var, text(loop.bound)
        end = f"({v}_blk + {tile} < {bound} ? {v}_blk + {tile} : {bound})"
        lines.append(f"{pad}{'    ' * depth}for ({loop.type} {v} = {v}_blk; {v} < {end}; ++{v}) {{")
    lines.append(f"{pad}{'    ' * 6}{text(statement)}")
    lines += [f"{pad}{'    ' * depth}}}" for depth in range(5, -1, -1)]
    return "\n".join(lines).lstrip()


def _with_flags(planner: CodePlanner, flag: str, unless: set[str]) -> Callable[[bytes], Plan]:
    """The code edits plus `flag` in extra_cflags (unless one of `unless` is there)."""

    def plan(data: bytes) -> Plan:
        edits = code_plan(data, "cpp", planner)
        if isinstance(edits, str) or not parsing.embedded_sources(data):
            return edits
        present = set(python_source.flag_values(data, "extra_cflags"))
        flags = flag_plan(data, "extra_cflags", [flag], set()) if not present & unless else []
        return edits + (flags if isinstance(flags, list) else [])

    return plan


REWRITES = [
    Rewrite(
        "cpu.omp_parallel_for",
        "cpu",
        "#pragma omp parallel for on outermost independent loops, -fopenmp",
        _with_flags(plan_parallel_for, "-fopenmp", {"-fopenmp"}),
    ),
    Rewrite(
        "cpu.omp_simd",
        "cpu",
        "#pragma omp simd (with + reductions) on innermost independent loops, -fopenmp-simd",
        _with_flags(plan_simd, "-fopenmp-simd", {"-fopenmp", "-fopenmp-simd"}),
    ),
    Rewrite(
        "cpu.opt_flags",
        "cpu",
        "compile with -O3 -march=native (extra_cflags)",
        lambda data: flag_plan(data, "extra_cflags", ["-O3", "-march=native"], LOW_OPT),
    ),
    Rewrite(
        "cpu.restrict",
        "cpu",
        "__restrict__ on pointer parameters",
        cpp(plan_restrict),
    ),
    tunable(
        "cpu.cache_block",
        "cpu",
        f"tile a simple i/j/k loop nest (autotuned: {TILE.values}; point loops in i/k/j order)",
        TILE,
        lambda tile: cpp(partial(plan_cache_block, tile=tile)),
    ),
]
