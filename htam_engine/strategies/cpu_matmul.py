"""Loop order and register blocking for a recognised matmul nest (`cpu.loop_order`).

Recognised: `for i { for j { T acc = INIT; for k acc += TERM; OUT = POST(acc); } }`
(the dot-product form) and `for i for j for k OUT += TERM` (the perfect nest), with OUT
indexed by i and j only and TERM free of side effects (`X * Y` in a matmul, one strided
load in a sum over a middle dimension). The operand indexed by j decides the order:

- j contiguous in it (`b[k * N + j]`, a row-major B): the k loop goes outside the j loop
  (i-k-j), and the innermost loop streams rows of B into a row of OUT under
  `#pragma omp simd`, four values of k per pass (a quarter of the OUT traffic); each
  output still sums its k terms in the original order.
- k contiguous in it (`w[j * K + k]`, nn.Linear's (N, K) weight): the dot product is the
  right order; four outputs are computed per pass over k (register blocking: each X is
  loaded once for four FMAs) with a vector reduction over k, and a scalar tail.

`cpu.register_tile` goes further: a micro-kernel keeps a tile of outputs (8 x 32 floats
with AVX-512, 16 zmm registers; 6 x 16 otherwise) in registers across the whole k loop,
so each loaded row piece of B feeds a tile's rows of FMAs and OUT is read and written
once; an (N, K) weight is first packed (transposed once per call) into a (K, N) buffer
so the tiles stream it along j as well; the edges run the original nest. Each output
still sums its k terms in the original order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine.parsing import cxx_source, embedded_sources, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.analysis import substitute, unit_stride
from htam_engine.strategies.base import (
    LOW_OPT,
    Edit,
    Plan,
    Rewrite,
    code_plan,
    flag_plan,
    indent_of,
)

BLOCK = 4  # outputs per pass in the register-blocked form
UNROLL = 4  # values of k per pass over an output row in the i-k-j form
SIDE_EFFECTS = ("assignment_expression", "update_expression", "call_expression")


@dataclass(frozen=True)
class Nest:
    i: analysis.Loop
    j: analysis.Loop
    k: analysis.Loop
    out: Node  # the OUT subscript
    product: Node  # the accumulated term (X * Y in a matmul)
    init: Node | None  # the accumulator's initial value (None: the perfect nest)
    acc: str  # the accumulator's name (the OUT text in the perfect nest)
    post: Node | None  # the value stored in OUT (None: the perfect nest)


def _statements(node: Node | None) -> list[Node]:
    if node is None:
        return []
    if node.type != "compound_statement":
        return [node]
    return [s for s in node.named_children if s.type not in ("comment", "preproc_call")]


def _update(statement: Node, op: str) -> tuple[Node, Node] | None:
    """(target, value) of `target op value;`."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    expr = statement.named_children[0]
    if expr.type != "assignment_expression" or text(expr.child_by_field_name("operator")) != op:
        return None
    left, right = expr.child_by_field_name("left"), expr.child_by_field_name("right")
    return (left, right) if left is not None and right is not None else None


def _loop(node: Node | None) -> analysis.Loop | None:
    loop = analysis.canonical(node) if node is not None else None
    return loop if loop is not None and loop.unit_step else None


def recognise(node: Node) -> Nest | str:
    """The matmul nest rooted at the for loop `node`, or why it is not one."""
    i = _loop(node)
    inner = _statements(i.node.child_by_field_name("body")) if i else []
    j = _loop(inner[0]) if len(inner) == 1 else None
    if i is None or j is None:
        return "no i/j loop pair"
    body = _statements(j.node.child_by_field_name("body"))
    if len(body) == 1:  # the perfect nest
        k = _loop(body[0])
        kbody = _statements(k.node.child_by_field_name("body")) if k else []
        update = _update(kbody[0], "+=") if len(kbody) == 1 else None
        if k is None or update is None:
            return "the j loop does not hold one k loop accumulating with +="
        out, product = update
        return _checked(Nest(i, j, k, out, product, None, text(out), None))
    if len(body) != 3 or body[0].type != "declaration":
        return "the j loop is not `T acc = init; for k ...; out = f(acc);`"
    declared = analysis.declared_names(body[0])
    k = _loop(body[1])
    kbody = _statements(k.node.child_by_field_name("body")) if k else []
    update = _update(kbody[0], "+=") if len(kbody) == 1 else None
    store = _update(body[2], "=")
    if len(declared) != 1 or k is None or update is None or store is None:
        return "the j loop is not `T acc = init; for k acc += ...; out = f(acc);`"
    acc, decl = next(iter(declared.items()))
    init = decl.child_by_field_name("value")
    if init is None or text(update[0]) != acc:
        return "the k loop does not accumulate into the declared accumulator"
    return _checked(Nest(i, j, k, store[0], update[1], init, acc, store[1]))


def _checked(nest: Nest) -> Nest | str:
    iv, jv, kv = nest.i.var, nest.j.var, nest.k.var
    out = nest.out
    if out.type != "subscript_expression" or not analysis.mentions(out, {iv}):
        return "the output is not indexed by i"
    if not analysis.mentions(out, {jv}) or analysis.mentions(out, {kv}):
        return "the output is not indexed by j alone among the inner loops"
    out_array = text(out.child_by_field_name("argument"))
    for part in (nest.product, nest.init, nest.post):
        if part is not None and any(
            n.type == "subscript_expression"
            and text(n.child_by_field_name("argument")) == out_array
            for n in walk(part)
        ):
            return "the output is read inside the nest"
    for part in (nest.product, nest.init):
        if part is not None and any(n.type in SIDE_EFFECTS for n in walk(part)):
            return "the product or the initial value has side effects or calls"
    for bound in (nest.j.bound, nest.k.bound):
        if analysis.mentions(bound, {iv, jv, kv}):
            return "the inner loop bounds depend on the loop indices"
    if nest.init is not None and analysis.mentions(nest.init, {kv, nest.acc}):
        return "the accumulator's initial value depends on k"
    return nest


def _j_operand(nest: Nest) -> Node | None:
    """The subscript of the product indexed by j (B or the weight)."""
    product = analysis.strip_parens(nest.product)
    assert product is not None
    found = [
        n
        for n in walk(product)
        if n.type == "subscript_expression" and analysis.mentions(n, {nest.j.var})
    ]
    return found[0] if len(found) == 1 else None


def _header(loop: analysis.Loop) -> str:
    update = loop.node.child_by_field_name("update")
    return (
        f"for ({loop.type} {loop.var} = {text(loop.start)}; {loop.var} < {text(loop.bound)}; "
        f"{text(update)})"
    )


def _ikj(nest: Nest, pad: str) -> str:
    """The i-k-j form; OUT serves as the accumulator row, updated once per UNROLL values of
    k (`out = out + t0 + t1 + ...` adds in the original order), then a k tail."""
    out, k, bound = text(nest.out), nest.k.var, text(nest.k.bound)
    terms = " + ".join(f"({substitute(nest.product, {k: f'({k} + {q})'})})" for q in range(UNROLL))
    lines = [f"{_header(nest.i)} {{"]
    if nest.init is not None:
        lines.append(f"    {_header(nest.j)} {out} = {text(nest.init)};")
    lines += [
        f"    {nest.k.type} {k} = {text(nest.k.start)};",
        f"    for (; {k} + {UNROLL} <= {bound}; {k} += {UNROLL}) {{",
        "#pragma omp simd",
        f"        {_header(nest.j)} {out} = {out} + {terms};",
        "    }",
        f"    for (; {k} < {bound}; ++{k}) {{",
        "#pragma omp simd",
        f"        {_header(nest.j)} {out} += {text(nest.product)};",
        "    }",
    ]
    if nest.post is not None and text(nest.post) != nest.acc:
        lines.append(f"    {_header(nest.j)} {out} = {substitute(nest.post, {nest.acc: out})};")
    lines.append("}")
    return f"\n{pad}".join(lines)


def _blocked(nest: Nest, pad: str) -> str:
    """BLOCK outputs per pass over k, then the original j body for the tail."""
    j, acc = nest.j.var, nest.acc
    assert nest.init is not None and nest.post is not None
    shifted = [{j: f"({j} + {q})"} for q in range(BLOCK)]
    accs = [f"{acc}_{q}" for q in range(BLOCK)]
    pairs = list(zip(accs, shifted, strict=True))
    tail = text(nest.j.node.child_by_field_name("body")).split("\n")
    decl = ", ".join(f"{a} = {substitute(nest.init, s)}" for a, s in pairs)
    acc_type = _acc_type(nest)
    updates = " ".join(f"{a} += {substitute(nest.product, s)};" for a, s in pairs)
    stores = [
        f"{substitute(nest.out, s)} = {substitute(nest.post, {**s, acc: a})};" for a, s in pairs
    ]
    lines = [
        f"{_header(nest.i)} {{",
        f"    {nest.j.type} {j} = {text(nest.j.start)};",
        f"    for (; {j} + {BLOCK} <= {text(nest.j.bound)}; {j} += {BLOCK}) {{",
        f"        {acc_type} {decl};",
        f"#pragma omp simd reduction(+:{', '.join(accs)})",
        f"        {_header(nest.k)} {{ {updates} }}",
        *(f"        {s}" for s in stores),
        "    }",
        f"    for (; {j} < {text(nest.j.bound)}; ++{j}) {tail[0]}",
        *tail[1:],
        "}",
    ]
    return f"\n{pad}".join(lines)


TILE_SIZES = (  # (rows, columns) of the register tile, chosen by the compiler's ISA macro
    "#if defined(__AVX512F__)",
    "enum {{ {rows} = 8, {cols} = 32 }};",
    "#else",
    "enum {{ {rows} = 6, {cols} = 16 }};",
    "#endif",
)


def _register_tile(nest: Nest, pad: str, packed: Node | None = None) -> str:
    """The micro-kernel over full tiles, then the original j body on the edges. With
    `packed` (the j operand, contiguous in k: an (N, K) weight), the tiles read a copy of
    it transposed once per call into a (K, N) buffer, so they stream it along j too; the
    copy is made only when there is a full tile to use it."""
    i, j, k = nest.i, nest.j, nest.k
    iv, jv = i.var, j.var
    rows, cols = f"{iv}{jv}_rows", f"{iv}{jv}_cols"
    tile, it, jt, ir, jq = f"{iv}{jv}_tile", f"{iv}_t", f"{jv}_t", f"{iv}_r", f"{jv}_q"
    at = {iv: f"({it} + {ir})", jv: f"({jt} + {jq})"}
    cell = f"{tile}[{ir}][{jq}]"
    if nest.init is None:  # the perfect nest accumulates onto OUT's own value
        acc_type = f"decltype({substitute(nest.out, {iv: it, jv: jt})} + 0)"  # no reference
        first, last = substitute(nest.out, at), cell
    else:
        acc_type, first = _acc_type(nest), substitute(nest.init, at)
        last = substitute(nest.post, {**at, nest.acc: cell}) if nest.post else cell
    i0, n_i, j0, n_j = (text(x) for x in (i.start, i.bound, j.start, j.bound))
    product, pack, unpack = substitute(nest.product, at), [], []
    if packed is not None:
        buffer = f"{jv}{k.var}_packed"

        def packed_cell(column: str) -> str:
            return f"{buffer}[({k.var} - {text(k.start)}) * ({n_j} - {j0}) + ({column} - {j0})]"

        product = substitute(nest.product, at, (packed, packed_cell(at[jv])))
        pack, unpack = _packing(nest, packed, buffer, packed_cell(jv)), [f"delete[] {buffer};"]

    def over_tile(statement: str, pad: str = "    ") -> list[str]:
        return [
            f"{pad}for (int {ir} = 0; {ir} < {rows}; ++{ir}) {{",
            "#pragma omp simd",
            f"{pad}    for (int {jq} = 0; {jq} < {cols}; ++{jq}) {statement};",
            f"{pad}}}",
        ]

    body = text(j.node.child_by_field_name("body"))
    lines = [
        "{",
        *(line.format(rows=rows, cols=cols) for line in TILE_SIZES),
        f"{i.type} {iv}_main = {i0} + ({n_i} - {i0}) / {rows} * {rows};",
        f"{j.type} {jv}_main = {j0} + ({n_j} - {j0}) / {cols} * {cols};",
        f"if ({iv}_main > {i0} && {jv}_main > {j0}) {{",
        *pack,
        f"for ({j.type} {jt} = {j0}; {jt} < {jv}_main; {jt} += {cols})",
        f"for ({i.type} {it} = {i0}; {it} < {iv}_main; {it} += {rows}) {{",
        f"    {acc_type} {tile}[{rows}][{cols}];",
        *over_tile(f"{cell} = {first}"),
        f"    {_header(k)} {{",
        *over_tile(f"{cell} += {product}", "        "),
        "    }",
        *over_tile(f"{substitute(nest.out, at)} = {last}"),
        "}",
        *unpack,
        "}",
        f"for ({i.type} {iv} = {i0}; {iv} < {iv}_main; ++{iv})",
        f"    for ({j.type} {jv} = {jv}_main; {jv} < {n_j}; ++{jv}) {body}",
        f"for ({i.type} {iv} = {iv}_main; {iv} < {n_i}; ++{iv})",
        f"    for ({j.type} {jv} = {j0}; {jv} < {n_j}; ++{jv}) {body}",
        "}",
    ]
    return f"\n{pad}".join(lines)


PACK_BLOCK = 32  # columns of the operand transposed together (lines reused across k)


def _packing(nest: Nest, operand: Node, buffer: str, cell: str) -> list[str]:
    """Allocate `buffer` and fill it with `operand` transposed, PACK_BLOCK rows of it at a
    time (a plain transpose writes one cache line per element)."""
    j, k = nest.j, nest.k
    jv, j0, n_j = j.var, text(j.start), text(j.bound)
    size = f"({n_j} - {j0}) * ({text(k.bound)} - {text(k.start)})"
    kind = f"decltype({substitute(operand, {jv: j0, k.var: text(k.start)})} + 0)"
    block = f"{jv}_b"
    return [
        f"{kind}* {buffer} = new {kind}[{size}];",
        f"for ({j.type} {block} = {j0}; {block} < {n_j}; {block} += {PACK_BLOCK})",
        f"    {_header(k)}",
        f"        for ({j.type} {jv} = {block}; {jv} < {block} + {PACK_BLOCK} && {jv} < {n_j}; "
        f"++{jv}) {cell} = {text(operand)};",
    ]


def _acc_type(nest: Nest) -> str:
    decl = nest.init.parent.parent if nest.init is not None and nest.init.parent else None
    kind = decl.child_by_field_name("type") if decl is not None else None
    return text(kind) if kind is not None else "float"


def reorders(code: bytes, node: Node) -> bool:
    """True when this rewrite would reorder or block the nest at `node`."""
    return not isinstance(_nest_edit(code, node), str)


def _nest_edit(code: bytes, node: Node) -> Edit | str:
    nest = recognise(node)
    if isinstance(nest, str):
        return nest
    index = _j_index(nest)
    if index is None:
        return "no single operand indexed by j"
    pad = indent_of(code, node)
    if unit_stride(index, nest.j.var):
        return (node.start_byte, node.end_byte, _ikj(nest, pad))
    if nest.init is not None and unit_stride(index, nest.k.var):
        return (node.start_byte, node.end_byte, _blocked(nest, pad))
    return "the j operand is contiguous in neither j nor k"


def _tile_edit(code: bytes, node: Node) -> Edit | str:
    nest = recognise(node)
    if isinstance(nest, str):
        return nest
    if _tiled_edge(node, nest):
        return "already register-tiled (this nest is a tile's edge)"
    operand = _j_operand(nest)
    index = operand.child_by_field_name("indices") if operand is not None else None
    if operand is None or index is None:
        return "no single operand indexed by j"
    pad = indent_of(code, node)
    if unit_stride(index, nest.j.var):
        return (node.start_byte, node.end_byte, _register_tile(nest, pad))
    if unit_stride(index, nest.k.var):  # an (N, K) weight: packed into (K, N) first
        return (node.start_byte, node.end_byte, _register_tile(nest, pad, operand))
    return "the j operand is contiguous in neither j nor k"


def _tiled_edge(node: Node, nest: Nest) -> bool:
    """True when `node` sits in the block a register tile of the same loops made."""
    name = f"{nest.i.var}{nest.j.var}_rows"
    block = node.parent
    return block is not None and any(
        n.type == "enumerator" and text(n.child_by_field_name("name")) == name for n in walk(block)
    )


def _j_index(nest: Nest) -> Node | None:
    operand = _j_operand(nest)
    return operand.child_by_field_name("indices") if operand is not None else None


def _nests(edit: Callable[[bytes, Node], Edit | str]) -> Callable[[bytes, Node], Plan]:
    """A planner applying `edit` to every outermost loop nest it takes."""

    def plan(code: bytes, root: Node) -> Plan:
        edits: list[Edit] = []
        reasons: list[str] = []
        for fn in cxx_source.functions(root):
            for node in analysis.outermost_loops(fn):
                done = edit(code, node)
                if isinstance(done, str):
                    reasons.append(done)
                else:
                    edits.append(done)
        return edits or (reasons[0] if reasons else "no loop nest")

    return plan


def _with_simd_flags(planner: Callable[[bytes, Node], Plan]) -> Callable[[bytes], Plan]:
    """The rewritten nest with the flags its simd loops pay with (a compound: at -O2
    without -march=native the vector row update runs at SSE width)."""

    def plan(data: bytes) -> Plan:
        edits = code_plan(data, "cpp", planner)
        if isinstance(edits, str) or not embedded_sources(data):
            return edits
        flags = flag_plan(data, "extra_cflags", ["-O3", "-march=native", "-fopenmp-simd"], LOW_OPT)
        return edits + (flags if isinstance(flags, list) else [])

    return plan


REWRITES = [
    Rewrite(
        "cpu.loop_order",
        "cpu",
        "matmul / strided-reduction nest: i-k-j order with a simd row update when j is "
        "contiguous (row-major B); 4 outputs per pass (register blocking) when k is (an "
        "(N, K) weight)",
        _with_simd_flags(_nests(_nest_edit)),
        compound=True,
    ),
    Rewrite(
        "cpu.register_tile",
        "cpu",
        "matmul nest: a micro-kernel holding a tile of outputs in registers over the whole k "
        "loop (8x32 with AVX-512, else 6x16), an (N, K) weight packed into (K, N) first; "
        "edges as before",
        _with_simd_flags(_nests(_tile_edit)),
        compound=True,
    ),
]
