"""CPU rewrites that shorten a one-thread loop's critical path or its passes: independent
accumulators for scalar reductions, fused softmax and moment passes, unroll pragmas and
hoisted invariants.

Timing runs one thread, so what pays is fewer dependent operations (a float sum the
compiler may not reassociate is one add latency per element), fewer passes over a row,
and fewer expensive operations inside an inner loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tree_sitter import Node

from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.analysis import substitute
from htam_engine.strategies.base import Edit, Param, Plan, Rewrite, cpp, indent_of, tunable
from htam_engine.strategies.cpu_math import PURE_CALLS, invariant, scalar_types

LANES = Param("accumulators", 4, (2, 4, 8))  # independent partial results of a reduction
UNROLL = Param("unroll", 4, (2, 4, 8))  # the factor of `#pragma GCC unroll`
FLOATING = ("float", "double")


def _fresh(base: str, taken: set[str]) -> str:
    """`base`, or `base` numbered, whichever is not yet a name of the function."""
    name, number = base, 1
    while name in taken:
        name, number = f"{base}{number}", number + 1
    taken.add(name)
    return name


def _block(node: Node, names: dict[str, str], pad: str, deeper: str) -> str:
    """The loop body `node` (at indentation `pad`) as a block `deeper` further in."""
    body = substitute(node, names).replace(f"\n{pad}", f"\n{pad}{deeper}")
    return body if node.type == "compound_statement" else f"{{ {body} }}"


def _anchor(node: Node) -> Node:
    """The loop, or the pragma right above it (what an edit before the loop goes before)."""
    previous = node.prev_named_sibling
    return previous if cxx_source.loop_pragma(node) and previous is not None else node


def _strict_bound(node: Node) -> bool:
    cond = node.child_by_field_name("condition")
    return cond is not None and text(cond.child_by_field_name("operator")) == "<"


# -- independent accumulators ---------------------------------------------------------


def _lane_init(op: str, name: str, kind: str) -> str:
    if op == "+":
        return "0.0f" if kind == "float" else "0.0"
    return name if op in ("max", "min") else ("1.0f" if kind == "float" else "1.0")


def _combine(op: str, name: str, lanes: list[str]) -> list[str]:
    if op == "+":
        every = [name, *lanes]
        pairs = [f"({a} + {b})" for a, b in zip(every[::2], every[1::2], strict=True)]
        return [f"{name} = {' + '.join(pairs)};"]
    if op == "*":
        return [f"{name} = {name} * {' * '.join(lanes)};"]
    compare = ">" if op == "max" else "<"
    return [f"{name} = ({lane} {compare} {name}) ? {lane} : {name};" for lane in lanes]


def _unit_stride_only(body: Node, var: str) -> bool:
    """True when every subscript in `body` that uses `var` steps by one element."""
    subscripts = [
        n.child_by_field_name("indices")
        for n in walk(body)
        if n.type == "subscript_expression" and analysis.mentions(n, {var})
    ]
    return all(index is not None and analysis.unit_stride(index, var) for index in subscripts)


def _split_plan(
    code: bytes, node: Node, types: dict[str, str], taken: set[str], lanes: int
) -> Edit | str:
    pragma = cxx_source.loop_pragma(node)
    if "simd" in pragma:
        return "the loop is already omp simd (the vectorizer keeps its own partial results)"
    if pragma:
        return f"the loop already carries `{pragma}`"
    loop = analysis.canonical(node)
    if loop is None or not loop.unit_step or not analysis.in_compound(node):
        return "an innermost loop is not a canonical unit-step for loop"
    if not _strict_bound(node):
        return "the loop bound is not a plain `<`"
    reductions: dict[str, str] = {}
    reason = analysis.carried_reason(loop, reductions)
    if reason is not None:
        return reason
    if not reductions:
        return "the loop reduces no outer scalar"
    wrong = [name for name in reductions if types.get(name) not in FLOATING]
    if wrong:
        return f"{wrong[0]!r} is not a float or double (the compiler reorders integer sums)"
    body = node.child_by_field_name("body")
    assert body is not None
    if _unit_stride_only(body, loop.var):
        return (
            "every access walks the loop with stride one: an omp simd reduction (vector "
            "math) vectorizes it, where split accumulators would keep it scalar"
        )
    pad, var, start, bound = indent_of(code, node), loop.var, text(loop.start), text(loop.bound)
    names = {n: [_fresh(f"{n}_{k}", taken) for k in range(1, lanes)] for n in sorted(reductions)}
    lines = ["{"]
    for name, partials in names.items():
        kind, op = types[name], reductions[name]
        inits = ", ".join(f"{lane} = {_lane_init(op, name, kind)}" for lane in partials)
        lines.append(f"    {kind} {inits};")
    # no declaration in either loop: the split loops are not candidates for a second split
    lines.append(f"    {loop.type} {var} = {start};")
    lines.append(f"    for (; {var} + {lanes - 1} < {bound}; {var} += {lanes}) {{")
    for k in range(lanes):
        renames = {name: partials[k - 1] for name, partials in names.items()} if k else {}
        if k:
            renames[var] = f"({var} + {k})"
        lines.append(f"        {_block(body, renames, pad, ' ' * 8)}")
    lines.append("    }")
    lines.append(f"    for (; {var} < {bound}; ++{var}) {_block(body, {}, pad, ' ' * 4)}")
    for name, partials in names.items():
        lines += [f"    {line}" for line in _combine(reductions[name], name, partials)]
    lines.append("}")
    return (node.start_byte, node.end_byte, f"\n{pad}".join(lines))


def plan_multi_accumulator(code: bytes, root: Node, lanes: int = LANES.default) -> Plan:
    edits: list[Edit] = []
    reasons: list[str] = []
    for fn in cxx_source.functions(root):
        types = scalar_types(fn)
        taken = {text(n) for n in walk(fn) if n.type == "identifier"}
        for node in cxx_source.innermost_loops(fn):
            plan = _split_plan(code, node, types, taken, lanes)
            if isinstance(plan, str):
                reasons.append(plan)
            else:
                edits.append(plan)
    return edits or _best_reason(reasons, "no loop reducing a scalar")


GENERIC = ("reduces no", "canonical", "does not only reduce", "a pass stores")


def _best_reason(reasons: list[str], default: str) -> str:
    """The first reason about a loop that looked like a candidate, else the first one."""
    telling = [r for r in reasons if not any(phrase in r for phrase in GENERIC)]
    return (telling or reasons or [default])[0]


# -- fused passes: online softmax, one-pass moments ---------------------------------------

BLOCK = Param("block", 256, (256, 1024, 4096))  # elements per block of the online softmax
EXP_CALLS = ("expf", "exp")


def _pass_pairs(block: Node) -> list[tuple[Node, list[Node], Node]]:
    """(first loop, statements between, next loop) for consecutive loops of a block."""
    statements = [s for s in block.named_children if s.type not in ("comment", "preproc_call")]
    loops = [i for i, s in enumerate(statements) if s.type == "for_statement"]
    return [
        (statements[a], statements[a + 1 : b], statements[b])
        for a, b in zip(loops, loops[1:], strict=False)
    ]


def _only_reduction(node: Node, op: str) -> tuple[analysis.Loop, str] | str:
    """The canonical loop `node` and the one outer scalar it reduces with `op`, writing
    nothing else; else why not."""
    loop = analysis.canonical(node)
    pragma = cxx_source.loop_pragma(node)
    if loop is None or not loop.unit_step or not _strict_bound(node):
        return "a pass is not a canonical unit-step `<` loop"
    if pragma and "omp simd" not in pragma:
        return f"a pass carries `{pragma}`"
    reductions: dict[str, str] = {}
    reason = analysis.carried_reason(loop, reductions)
    if reason is not None:
        return reason
    if list(reductions.values()) != [op]:
        return f"a pass does not only reduce one scalar with {op}"
    body = node.child_by_field_name("body")
    assert body is not None
    if any(t.type != "identifier" for t, _ in analysis.write_targets(body)):
        return "a pass stores to memory"
    return loop, next(iter(reductions))


def _update(body: Node) -> Node | None:
    """The only statement of a loop body, an assignment expression."""
    statements = [s for s in body.named_children if s.type != "comment"]
    statement = (
        statements[0] if body.type == "compound_statement" and len(statements) == 1 else body
    )
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    expr = statement.named_children[0]
    return expr if expr.type == "assignment_expression" else None


def _exp_of_difference(node: Node | None, m: str) -> bool:
    """`expf(A - m)` with A free of `m`."""
    node = analysis.strip_parens(node)
    if node is None or node.type != "call_expression":
        return False
    args = node.child_by_field_name("arguments")
    if text(node.child_by_field_name("function")) not in EXP_CALLS or args is None:
        return False
    inner = analysis.strip_parens(args.named_children[0]) if len(args.named_children) == 1 else None
    if inner is None or inner.type != "binary_expression":
        return False
    left, right = inner.child_by_field_name("left"), inner.child_by_field_name("right")
    minus = text(inner.child_by_field_name("operator")) == "-"
    return minus and left is not None and text(right) == m and not analysis.mentions(left, {m})


def _softmax_pair(
    code: bytes, first: Node, between: list[Node], second: Node, taken: set[str], block: int
) -> Edit | str:
    """A max pass then `s += expf(x - m)` pass -> one blocked pass: each block's max, the
    running sum rescaled by expf(m_old - m) when the max grows, the block's exps."""
    maximum = _only_reduction(first, "max")
    if isinstance(maximum, str):
        return maximum
    summed = _only_reduction(second, "+")
    if isinstance(summed, str):
        body = second.child_by_field_name("body")
        stores = body is not None and any(
            t.type != "identifier" for t, _ in analysis.write_targets(body)
        )
        if stores and analysis.mentions(second, {maximum[1]}):
            return (
                "the sum pass stores values relative to the max (a fused pass would rescale them)"
            )
        return summed
    (max_loop, m), (sum_loop, s) = maximum, summed
    update = _update(second.child_by_field_name("body") or second)
    if update is None or text(update.child_by_field_name("operator")) != "+=":
        return "the sum pass is not one `s += expf(x - m)`"
    if not _exp_of_difference(update.child_by_field_name("right"), m):
        return "the sum pass does not add expf(x - m)"
    if text(max_loop.bound) != text(sum_loop.bound) or max_loop.var != sum_loop.var:
        return "the passes run over different ranges"
    if analysis.mentions(first, {s}) or any(
        analysis.mentions(b, {m}) or b.type != "declaration" for b in between
    ):
        return "the statements between the passes are not declarations independent of the max"
    loops = (max_loop, sum_loop)
    return _blocked_softmax(code, (first, between, second), loops, m, s, taken, block)


def _blocked_softmax(
    code: bytes,
    passes: tuple[Node, list[Node], Node],
    loops: tuple[analysis.Loop, analysis.Loop],
    m: str,
    s: str,
    taken: set[str],
    block: int,
) -> Edit:
    (first, between, second), (max_loop, sum_loop) = passes, loops
    pad, var, kind = indent_of(code, first), max_loop.var, max_loop.type
    starts = [text(max_loop.start), text(sum_loop.start)]
    if all(start.isdigit() for start in starts):
        low = str(min(int(start) for start in starts))
    elif starts[0] == starts[1]:
        low = starts[0]
    else:
        low = f"({starts[0]} < {starts[1]} ? {starts[0]} : {starts[1]})"
    blk, stop, old = (
        _fresh(f"{var}_blk", taken),
        _fresh(f"{var}_stop", taken),
        _fresh(f"{m}_old", taken),
    )
    bound = text(max_loop.bound)
    lines = [text(b) for b in between]
    lines.append(f"for ({kind} {blk} = {low}; {blk} < {bound}; {blk} += {block}) {{")
    lines.append(
        f"    const {kind} {stop} = {blk} + {block} < {bound} ? {blk} + {block} : {bound};"
    )
    lines.append(f"    const auto {old} = {m};")
    for node, start in ((first, starts[0]), (second, starts[1])):
        if node is second:
            lines.append(f"    if ({m} != {old}) {s} *= expf({old} - {m});")
        begin = blk if start == low else f"({blk} > {start} ? {blk} : {start})"
        pragma = cxx_source.loop_pragma(node)
        if pragma:
            lines.append(f"    {pragma}")
        body = node.child_by_field_name("body")
        assert body is not None
        header = f"for ({kind} {var} = {begin}; {var} < {stop}; ++{var})"
        lines.append(f"    {header} {_block(body, {}, pad, ' ' * 4)}")
    lines.append("}")
    return (_anchor(first).start_byte, second.end_byte, f"\n{pad}".join(lines))


def _squared_difference(node: Node, mean: str, value: str) -> bool:
    """`node` (locals inlined) is (value - mean) * (value - mean)."""
    flat = "".join(text(node).split())
    return flat == f"({value}-{mean})*({value}-{mean})"


def _inlined(body: Node, update: Node) -> str | None:
    """The right side of `update` with the body's local declarations substituted."""
    values: dict[str, str] = {}
    for statement in body.named_children:
        if statement.type == "declaration":
            for name, decl in analysis.declared_names(statement).items():
                value = decl.child_by_field_name("value")
                if value is None:
                    return None
                values[name] = f"({substitute(value, values)})"
        elif statement.type not in ("comment", "expression_statement"):
            return None
    right = update.child_by_field_name("right")
    return substitute(right, values) if right is not None else None


def _moments_pair(
    code: bytes,
    first: Node,
    between: list[Node],
    second: Node,
    types: dict[str, str],
    taken: set[str],
) -> list[Edit] | str:
    """A mean pass (`mean += v`) then a `var += (v - mean)^2` pass -> one pass summing v and
    v*v in double; the variance is sum(v^2) - 2*mean*sum(v) + n*mean^2 for the mean the
    second pass would have used."""
    summed = _only_reduction(first, "+")
    squared = _only_reduction(second, "+")
    if isinstance(summed, str) or isinstance(squared, str):
        return summed if isinstance(summed, str) else str(squared)
    (sum_loop, mean), (sq_loop, var) = summed, squared
    body, update = (
        first.child_by_field_name("body"),
        _update(first.child_by_field_name("body") or first),
    )
    second_body = second.child_by_field_name("body")
    assert body is not None and second_body is not None
    if update is None or text(update.child_by_field_name("operator")) != "+=":
        return "the first pass is not one `mean += v`"
    value = update.child_by_field_name("right")
    assert value is not None
    square_update = [n for n in walk(second_body) if n.type == "assignment_expression"]
    inlined = _inlined(second_body, square_update[-1]) if square_update else None
    if inlined is None or "".join(inlined.split()) != "".join(
        f"({text(value)}-{mean})*({text(value)}-{mean})".split()
    ):
        return "the second pass does not add (v - mean) * (v - mean)"
    same = (text(sum_loop.start), text(sum_loop.bound), sum_loop.var)
    if same != (text(sq_loop.start), text(sq_loop.bound), sq_loop.var):
        return "the passes run over different ranges"
    written = {text(t) for b in between for t, _ in analysis.write_targets(b)}
    if analysis.mentions(value, written | {var}) or any(
        t.type != "identifier" for b in between for t, _ in analysis.write_targets(b)
    ):
        return "the statements between the passes change what the passes read"
    if types.get(mean) not in FLOATING or types.get(var) not in FLOATING:
        return "the mean and variance are not float or double"
    pad, start, bound = indent_of(code, first), text(sum_loop.start), text(sum_loop.bound)
    total, squares, v = (
        _fresh(f"{mean}_sum", taken),
        _fresh(f"{mean}_sq", taken),
        _fresh("v", taken),
    )
    lines = [f"double {total} = 0.0, {squares} = 0.0;"]
    if "simd" in cxx_source.loop_pragma(first):
        lines.append(f"#pragma omp simd reduction(+:{total}, {squares})")
    c = sum_loop.var
    lines += [
        f"for ({sum_loop.type} {c} = {start}; {c} < {bound}; ++{c}) {{",
        f"    const double {v} = {text(value)};",
        f"    {total} += {v};",
        f"    {squares} += {v} * {v};",
        "}",
        f"{mean} += ({types[mean]})({total});",
    ]
    count = f"(double)({bound})" if start == "0" else f"(double)(({bound}) - ({start}))"
    moments = f"{squares} - 2.0 * {mean} * {total} + {count} * {mean} * {mean}"
    return [
        (_anchor(first).start_byte, first.end_byte, f"\n{pad}".join(lines)),
        (_anchor(second).start_byte, second.end_byte, f"{var} += ({types[var]})({moments});"),
    ]


def _fuse_plan(
    pair_planner: Callable[..., Edit | list[Edit] | str], default: str
) -> Callable[[bytes, Node], Plan]:
    def plan(code: bytes, root: Node) -> Plan:
        edits: list[Edit] = []
        reasons: list[str] = []
        for fn in cxx_source.functions(root):
            types = scalar_types(fn)
            taken = {text(n) for n in walk(fn) if n.type == "identifier"}
            for block in (n for n in walk(fn) if n.type == "compound_statement"):
                for first, between, second in _pass_pairs(block):
                    found = pair_planner(code, first, between, second, types, taken)
                    if isinstance(found, str):
                        reasons.append(found)
                    else:
                        edits += found if isinstance(found, list) else [found]
        return edits or _best_reason(reasons, default)

    return plan


# -- unroll pragmas ---------------------------------------------------------------------


def plan_unroll(code: bytes, root: Node, factor: int = UNROLL.default) -> Plan:
    edits: list[Edit] = []
    reasons: list[str] = []
    for fn in cxx_source.functions(root):
        for node in cxx_source.innermost_loops(fn):
            pragma = cxx_source.loop_pragma(node)
            loop = analysis.canonical(node)
            if pragma:
                reasons.append(f"the loop already carries `{pragma}`")
            elif loop is None or not analysis.in_compound(node):
                reasons.append("an innermost loop is not a canonical counted for loop")
            else:
                edits.append(
                    (
                        node.start_byte,
                        node.start_byte,
                        f"#pragma GCC unroll {factor}\n{indent_of(code, node)}",
                    )
                )
    return edits or _best_reason(reasons, "no innermost loop")


# -- hoisting invariants ----------------------------------------------------------------

HOISTED = ("binary_expression", "call_expression", "subscript_expression", "pointer_expression")
# a hoisted expression holds one of HOISTED[1:]: a call or a load


def _hoistable(node: Node, loop: analysis.Loop, stores: bool) -> bool:
    """An expression worth computing once: invariant, side-effect free, with a math call or
    a load (index arithmetic alone GCC hoists itself, measured no gain), and reading memory
    only when the loop writes none."""
    if node.type not in HOISTED or not invariant(node, loop):
        return False
    if not any(n.type in HOISTED[1:] for n in walk(node)):
        return False
    if node.type == "pointer_expression" and text(node.child_by_field_name("operator")) != "*":
        return False
    parent = node.parent
    if (
        parent is not None
        and parent.type == "pointer_expression"
        and parent.child_by_field_name("operator")
        and text(parent.child_by_field_name("operator")) == "&"
    ):
        return False  # its address is taken
    if not any(n.type == "identifier" for n in walk(node)):
        return False
    for n in walk(node):
        if n.type in ("assignment_expression", "update_expression"):
            return False
        if (
            n.type == "call_expression"
            and text(n.child_by_field_name("function")) not in PURE_CALLS
        ):
            return False
        if n.type == "binary_expression" and text(n.child_by_field_name("operator")) in ("/", "%"):
            return False  # may trap (integer) or is cpu.reciprocal's move (floating)
        if n.type in ("subscript_expression", "pointer_expression") and stores:
            return False  # the loop's stores may alias the load
    return True


def _hoist_plan(code: bytes, node: Node, taken: set[str]) -> list[Edit] | str:
    loop = analysis.canonical(node)
    body = node.child_by_field_name("body")
    if loop is None or body is None or not analysis.in_compound(node):
        return "an innermost loop is not a canonical counted for loop"
    stores = any(t.type != "identifier" for t, _ in analysis.write_targets(body))
    found: list[Node] = []
    for n in walk(body):
        if _hoistable(n, loop, stores) and not any(analysis.within(n, f) for f in found):
            found.append(n)
    if not found:
        return "no loop-invariant computation in an innermost loop"
    names: dict[str, str] = {}
    edits: list[Edit] = []
    anchor = _anchor(node)
    for n in found:
        if text(n) not in names:
            names[text(n)] = _fresh("inv", taken)
            line = f"const auto {names[text(n)]} = {text(n)};\n{indent_of(code, anchor)}"
            edits.append((anchor.start_byte, anchor.start_byte, line))
        edits.append((n.start_byte, n.end_byte, names[text(n)]))
    return edits


def plan_hoist(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons: list[str] = []
    for fn in cxx_source.functions(root):
        taken = {text(n) for n in walk(fn) if n.type == "identifier"}
        for node in cxx_source.innermost_loops(fn):
            plan = _hoist_plan(code, node, taken)
            if isinstance(plan, str):
                reasons.append(plan)
            else:
                edits += plan
    return edits or _best_reason(reasons, "no innermost loop")


def _online_softmax(block: int) -> Callable[[bytes], Plan]:
    def pair(
        code: bytes, first: Node, between: list[Node], second: Node, _: object, taken: set[str]
    ) -> Edit | str:
        return _softmax_pair(code, first, between, second, taken, block)

    return cpp(_fuse_plan(pair, "no two consecutive passes"))


REWRITES = [
    tunable(
        "cpu.online_softmax",
        "cpu",
        "a max pass then a sum-of-expf(x - max) pass fused into one pass over blocks "
        f"(autotuned: {BLOCK.values} elements; block max, running sum rescaled by "
        "expf(old - new max) when it grows)",
        BLOCK,
        _online_softmax,
    ),
    Rewrite(
        "cpu.fuse_moments",
        "cpu",
        "a mean pass then a squared-deviation pass fused into one pass accumulating the sum "
        "and the sum of squares in double",
        cpp(_fuse_plan(_moments_pair, "no two consecutive passes")),
    ),
    tunable(
        "cpu.multi_accumulator",
        "cpu",
        f"a float sum/max/min reduction loop split into independent accumulators (autotuned: "
        f"{LANES.values}) combined after the loop, with a remainder loop",
        LANES,
        lambda lanes: cpp(partial(plan_multi_accumulator, lanes=lanes)),
    ),
    tunable(
        "cpu.unroll",
        "cpu",
        f"#pragma GCC unroll N (autotuned: {UNROLL.values}) on innermost counted loops "
        "without a pragma",
        UNROLL,
        lambda factor: cpp(partial(plan_unroll, factor=factor)),
    ),
    Rewrite(
        "cpu.hoist_invariants",
        "cpu",
        "loop-invariant math calls and (with no stores in the loop) loads computed once "
        "before the inner loop",
        cpp(plan_hoist),
    ),
]
