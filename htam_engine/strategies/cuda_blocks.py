"""Mechanical CUDA rewrites of whole blocks of a kernel: a shared-memory tree reduction
finished with warp shuffles, and a naive matmul staged through shared-memory tiles."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.base import Edit, Plan, Rewrite, code_plan, indent_of, mentions
from htam_engine.strategies.cuda import block_literal, launch_bounds_literal, plan_kernels

TILE = 16
FULL_MASK = "0xffffffff"


def _flat(node: Node | None) -> str:
    """The node's text without whitespace, for comparing expressions by spelling."""
    return re.sub(r"\s+", "", text(node))


def _statements(node: Node | None) -> list[Node]:
    """The statements of a compound (or the single statement itself), comments left out."""
    if node is None:
        return []
    if node.type != "compound_statement":
        return [node]
    return [s for s in node.named_children if s.type != "comment"]


def _single_declarator(statement: Node) -> Node | None:
    declarators = [d for d in statement.named_children if d.type == "init_declarator"]
    ok = statement.type == "declaration" and len(declarators) == 1
    return declarators[0] if ok else None


def _launches_of(root: Node, kernel: Node) -> list[Node]:
    name = cxx_source.function_name(kernel)
    return [c for c in cxx_source.launches(root) if text(c.child_by_field_name("function")) == name]


# ------------------------------------------------------------------ warp-shuffle reduction


@dataclass(frozen=True)
class Tree:
    """`for (s = blockDim.x / 2; s > 0; s >>= 1) { if (tid < s) A[tid] op= A[tid + s];
    __syncthreads(); }` over a __shared__ array A of `kind`, tid being threadIdx.x."""

    loop: Node
    condition: Node
    array: str
    tid: str
    kind: str
    operator: str  # "+", "max" or "min"


def _halves(loop: Node) -> str | None:
    """The loop variable when the loop's update halves it, else None."""
    update = _flat(loop.child_by_field_name("update"))
    found = re.fullmatch(r"(\w+)(>>=1|/=2|=\1>>1|=\1/2)", update)
    return found.group(1) if found else None


def _combine_operator(step: Node, array: str, tid: str, var: str) -> str:
    """+, max or min when `step` is `A[tid] op= A[tid + s]` (or `A[tid] = f(A[tid],
    A[tid + s])`), else a reason."""
    if step.type == "expression_statement" and step.named_children:
        step = step.named_children[0]
    left = step.child_by_field_name("left") if step.type == "assignment_expression" else None
    if left is None or _flat(left) != f"{array}[{tid}]":
        return f"the tree's step is not an update of {array}[{tid}]"
    op = text(step.child_by_field_name("operator"))
    right = analysis.strip_parens(step.child_by_field_name("right"))
    partner = {f"{array}[{tid}+{var}]", f"{array}[{var}+{tid}]"}
    unpaired = f"the tree's step does not combine {array}[{tid}] with {array}[{tid} + {var}]"
    if op == "+=":
        return "+" if _flat(right) in partner else unpaired
    if op != "=" or right is None:
        return f"the tree combines with {op!r}, not a commutative +, max or min"
    operands = _operands(right)
    kinds = {_flat(o) for o in operands}
    if len(operands) != 2 or f"{array}[{tid}]" not in kinds or not kinds & partner:
        return unpaired
    if right.type == "binary_expression":
        found = text(right.child_by_field_name("operator"))
        return "+" if found == "+" else f"the tree combines with {found!r}, not +, max or min"
    return analysis.select_operator(right, text(left)) or "the tree's step is not +, max or min"


def _operands(expression: Node) -> list[Node]:
    if expression.type == "call_expression":
        args = expression.child_by_field_name("arguments")
        return list(args.named_children) if args is not None else []
    if expression.type == "conditional_expression":
        expression = (
            analysis.strip_parens(expression.child_by_field_name("condition")) or expression
        )
    if expression.type == "binary_expression":
        sides = (expression.child_by_field_name("left"), expression.child_by_field_name("right"))
        return [s for s in map(analysis.strip_parens, sides) if s is not None]
    return []


def _shared_array(root: Node, name: str) -> str | None:
    """The element type of the __shared__ array `name`, or None when there is none."""
    for node in walk(root):
        if node.type != "declaration" or "__shared__" not in map(text, node.children):
            continue
        for declarator in node.named_children:
            if (
                declarator.type == "array_declarator"
                and text(declarator.child_by_field_name("declarator")) == name
            ):
                return text(node.child_by_field_name("type"))
    return None


def _is_thread_x(kernel: Node, tid: str) -> bool:
    """`tid` is threadIdx.x itself or a variable set once to it."""
    if tid == "threadIdx.x":
        return True
    declared = analysis.declared_names(kernel).get(tid)
    value = declared.child_by_field_name("value") if declared is not None else None
    body = kernel.child_by_field_name("body")
    written = body is not None and any(text(t) == tid for t, _ in analysis.write_targets(body))
    return _flat(value) == "threadIdx.x" and not written


def _tree(root: Node, kernel: Node, loop: Node, var: str) -> Tree | str:
    declarator = _single_declarator(loop.child_by_field_name("initializer") or loop)
    start = declarator.child_by_field_name("value") if declarator is not None else None
    if _flat(start) not in ("blockDim.x/2", "blockDim.x>>1"):
        return "the tree does not start at blockDim.x / 2"
    condition = loop.child_by_field_name("condition")
    if _flat(condition) != f"{var}>0":
        return f"the tree does not run while {var} > 0"
    body = _statements(loop.child_by_field_name("body"))
    if len(body) != 2 or body[0].type != "if_statement" or _flat(body[1]) != "__syncthreads();":
        return f"the tree's body is not `if (tid < {var}) ...; __syncthreads();`"
    test = analysis.strip_parens(body[0].child_by_field_name("condition"))
    test = test.named_children[0] if test is not None and test.named_children else None
    steps = _statements(body[0].child_by_field_name("consequence"))
    guard = (
        test is not None
        and test.type == "binary_expression"
        and text(test.child_by_field_name("operator")) == "<"
        and _flat(test.child_by_field_name("right")) == var
    )
    if test is None or not guard or body[0].child_by_field_name("alternative"):
        return f"the tree's guard is not `if (tid < {var})`"
    if len(steps) != 1:
        return "the tree's guarded step is not a single update"
    tid = _flat(test.child_by_field_name("left"))
    left = steps[0].named_children[0] if steps[0].named_children else steps[0]
    target = left.child_by_field_name("left") if left.type == "assignment_expression" else None
    array = text(target.child_by_field_name("argument")) if target is not None else ""
    operator = _combine_operator(steps[0], array, tid, var)
    kind = _shared_array(root, array)
    if operator not in ("+", "max", "min"):
        return operator
    if kind is None:
        return f"{array!r} is not a __shared__ array"
    if not _is_thread_x(kernel, tid):
        return f"the tree's index {tid!r} is not threadIdx.x"
    if kind not in ("float", "double", "int"):
        return f"{array!r} holds {kind}, not float, double or int"
    if {tid, array} & {"v", "offset"}:
        return "the names v and offset are taken by the tree"
    assert condition is not None
    return Tree(loop, condition, array, tid, kind, operator)


def _block_reason(root: Node, kernel: Node) -> str | None:
    """Why the block size is not known to be a power of two from 32 to 1024, or None."""
    calls = _launches_of(root, kernel)
    literals = [block_literal(root, c) for c in calls] or [launch_bounds_literal(kernel)]
    for literal in literals:
        if literal is None or not text(literal).strip().isdigit():
            where = "a launch with a constant block" if calls else "__launch_bounds__"
            return f"its block size is not known (no {where} in this source)"
        size = int(text(literal).strip())
        if size < 32 or size > 1024 or size & (size - 1):
            return f"its block of {size} threads is not a power of two from 32 to 1024"
    return None


def _combine(tree: Tree, value: str) -> str:
    """The statement folding `value` into `v`."""
    if tree.operator == "+":
        return f"v += {value};"
    name = {"float": f"f{tree.operator}f", "double": f"f{tree.operator}"}.get(tree.kind)
    return f"v = {name or tree.operator}(v, {value});"


def _warp_step(code: bytes, tree: Tree) -> str:
    """After the shared tree stops at 64 elements: warp 0 folds them with shuffles and
    leaves the result in A[0] for every thread, as the full tree did."""
    pad = indent_of(code, tree.loop)
    a, tid = tree.array, tree.tid
    shuffle = f"__shfl_down_sync({FULL_MASK}, v, offset)"
    lines = [
        f"if ({tid} < 32) {{",
        f"    {tree.kind} v = {a}[{tid}];",
        f"    if (blockDim.x >= 64) {_combine(tree, f'{a}[{tid} + 32]')}",
        "    for (int offset = 16; offset > 0; offset >>= 1)",
        f"        {_combine(tree, shuffle)}",
        f"    if ({tid} == 0) {a}[0] = v;",
        "}",
        "__syncthreads();",
    ]
    return "".join(f"\n{pad}{line}" for line in lines)


def _reduce_kernel(code: bytes, root: Node, kernel: Node) -> Plan:
    body = kernel.child_by_field_name("body")
    if body is None or "__shfl" in text(body):
        return "it already reduces with warp shuffles"
    candidates = [(loop, var) for loop in cxx_source.loops(body) if (var := _halves(loop))]
    if not candidates:
        return "no shared-memory tree reduction (`for (s = blockDim.x / 2; s > 0; s >>= 1)`)"
    edits: list[Edit] = []
    for loop, var in candidates:
        tree = _tree(root, kernel, loop, var)
        if isinstance(tree, str):
            return tree
        if loop.parent != body:
            return "the tree is not at the top level of the kernel (all threads must reach it)"
        after = [n for n in walk(body) if n.start_byte >= loop.end_byte]
        if any(
            n.type == "subscript_expression"
            and text(n.child_by_field_name("argument")) == tree.array
            and _flat(n.child_by_field_name("indices")) != "[0]"
            for n in after
        ):
            return f"{tree.array!r} is read at other indices than 0 after the tree"
        edits.append((tree.condition.start_byte, tree.condition.end_byte, f"{var} > 32"))
        edits.append((loop.end_byte, loop.end_byte, _warp_step(code, tree)))
    return _block_reason(root, kernel) or edits


def plan_warp_shuffle_reduce(code: bytes, root: Node) -> Plan:
    return plan_kernels(root, lambda kernel: _reduce_kernel(code, root, kernel))


# ---------------------------------------------------------------- shared-memory tiling

X_INDEX = {"blockIdx.x*blockDim.x+threadIdx.x", "threadIdx.x+blockIdx.x*blockDim.x"}
Y_INDEX = {"blockIdx.y*blockDim.y+threadIdx.y", "threadIdx.y+blockIdx.y*blockDim.y"}
NEW_NAMES = {"tile_a", "tile_b", "k0", "ka", "kb"}


@dataclass(frozen=True)
class Declaration:
    """`T name = value;` with a single declarator; `value` is spelled without spaces."""

    type: str
    name: str
    value: str
    literal: bool  # the value is a number literal
    statement: Node


def _declaration(statement: Node) -> Declaration | None:
    declarator = _single_declarator(statement)
    value = declarator.child_by_field_name("value") if declarator is not None else None
    if declarator is None or value is None:
        return None
    kind = text(statement.child_by_field_name("type"))
    name = text(declarator.child_by_field_name("declarator"))
    return Declaration(kind, name, _flat(value), value.type == "number_literal", statement)


@dataclass(frozen=True)
class Matmul:
    """One thread per output: `acc = 0; for (k < K) acc += A[row*K + k] * B[k*N + col];`
    then an epilogue storing C[row*N + col] (row, col from blockIdx/threadIdx)."""

    index_type: str
    row: str
    col: str
    flat: str | None  # the one-dimensional index row and col were derived from
    sizes: tuple[str, str, str]  # M, N, K: kernel parameters
    a: str
    b: str
    element: str
    accumulator: Declaration
    epilogue: list[Node]


@dataclass(frozen=True)
class Grid:
    """Where each thread's output sits and the statements it runs when in bounds."""

    index_type: str
    row: str
    col: str
    flat: str | None
    m: str
    n: str
    inner: list[Node]


def _flat_grid(kernel: Node) -> Grid | str:
    """`idx = blockIdx.x * blockDim.x + threadIdx.x; if (idx < M * N) { row = idx / N;
    col = idx % N; ... }`."""
    guard = analysis.thread_guard(kernel)
    if isinstance(guard, str):
        return guard
    inner = _statements(guard.body)
    row, col = (_declaration(s) for s in inner[:2]) if len(inner) >= 2 else (None, None)
    n = re.fullmatch(rf"{guard.var}/(\w+)", row.value) if row is not None else None
    if _flat(guard.index) not in X_INDEX or row is None or col is None or n is None:
        return f"the guarded body does not derive row and col as {guard.var} / N, {guard.var} % N"
    m = re.fullmatch(rf"(\w+)\*{n[1]}|{n[1]}\*(\w+)", _flat(guard.bound))
    if col.value != f"{guard.var}%{n[1]}" or m is None:
        return f"the guard is not `{guard.var} < M * {n[1]}` with `col = {guard.var} % {n[1]}`"
    return Grid(row.type, row.name, col.name, guard.var, m[1] or m[2], n[1], inner[2:])


def _square_grid(kernel: Node) -> Grid | str:
    """`row = blockIdx.y * blockDim.y + threadIdx.y; col = (x likewise);
    if (row < M && col < N) { ... }`."""
    body = _statements(kernel.child_by_field_name("body"))
    declared = [d for d in map(_declaration, body[:2]) if d is not None]
    row = next((d for d in declared if d.value in Y_INDEX), None)
    col = next((d for d in declared if d.value in X_INDEX), None)
    branch = body[2] if len(body) == 3 else None
    if row is None or col is None or branch is None or branch.type != "if_statement":
        return "row and col are not blockIdx.y/x * blockDim.y/x + threadIdx.y/x over one `if`"
    condition = branch.child_by_field_name("condition")
    test = _flat(condition.named_children[0] if condition and condition.named_children else None)
    found = re.fullmatch(rf"{row.name}<(\w+)&&{col.name}<(\w+)", test)
    swapped = re.fullmatch(rf"{col.name}<(\w+)&&{row.name}<(\w+)", test)
    if (found or swapped) is None or branch.child_by_field_name("alternative") is not None:
        return f"the guard is not `if ({row.name} < M && {col.name} < N)`"
    m, n = found.groups() if found else swapped.groups()[::-1]  # type: ignore[union-attr]
    inner = _statements(branch.child_by_field_name("consequence"))
    return Grid(row.type, row.name, col.name, None, m, n, inner)


def _dot_product(loop: Node, grid: Grid) -> tuple[str, str, str, str] | str:
    """(accumulator, A, B, K) of `for (k = 0; k < K; ++k) acc += A[row*K+k] * B[k*N+col]`."""
    canonical = analysis.canonical(loop)
    if canonical is None or not canonical.unit_step or _flat(canonical.start) != "0":
        return "the dot product is not `for (int k = 0; k < K; ++k)`"
    steps = _statements(loop.child_by_field_name("body"))
    step = steps[0].named_children[0] if len(steps) == 1 and steps[0].named_children else None
    product = analysis.strip_parens(step.child_by_field_name("right")) if step else None
    factors = _operands(product) if product is not None and _operator(product) == "*" else []
    if step is None or _operator(step) != "+=" or len(factors) != 2:
        return "the dot product's body is not one `acc += A[...] * B[...]`"
    k, big_k, row, col, n = canonical.var, _flat(canonical.bound), grid.row, grid.col, grid.n
    wanted = (
        (f"[{row}*{big_k}+{k}]", f"[{k}+{row}*{big_k}]"),
        (f"[{k}*{n}+{col}]", f"[{col}+{k}*{n}]"),
    )
    if _flat(factors[1].child_by_field_name("indices")) in wanted[0]:
        factors.reverse()
    for factor, forms in zip(factors, wanted, strict=True):
        name, index = text(factor.child_by_field_name("argument")), _flat(factor)
        if factor.type != "subscript_expression" or index[len(name) :] not in forms:
            return f"{name} is read as {index}, not with unit stride as {name}{forms[0]}"
    names = [text(f.child_by_field_name("argument")) for f in factors]
    return text(step.child_by_field_name("left")), names[0], names[1], big_k


def _operator(node: Node) -> str:
    return text(node.child_by_field_name("operator"))


def _epilogue_reason(grid: Grid, epilogue: list[Node]) -> str | None:
    stores = {f"[{grid.row}*{grid.n}+{grid.col}]", f"[{grid.flat}]"}
    for statement in epilogue:
        for target, _ in analysis.write_targets(statement):
            index = _flat(target.child_by_field_name("indices"))
            if target.type == "subscript_expression" and index not in stores:
                return f"the result is not stored at C[{grid.row} * {grid.n} + {grid.col}]"
        if "__syncthreads" in text(statement) or any(
            n.type in analysis.EXITS for n in walk(statement)
        ):
            return "the store after the dot product synchronises or exits"
    return None


def _matmul(kernel: Node) -> Matmul | str:
    body = _statements(kernel.child_by_field_name("body"))
    grid = _flat_grid(kernel) if len(body) == 2 else _square_grid(kernel)
    if isinstance(grid, str):
        return grid
    accumulator = _declaration(grid.inner[0]) if grid.inner else None
    loop = grid.inner[1] if len(grid.inner) > 1 else None
    if accumulator is None or loop is None:
        return "the guarded body is not `acc = <literal>; for (k ...) acc += ...; <store>`"
    if not accumulator.literal:
        return f"the accumulator {accumulator.name!r} does not start from a literal"
    dot = _dot_product(loop, grid)
    if isinstance(dot, str):
        return dot
    acc, a, b, k = dot
    params = _names(kernel)
    if acc != accumulator.name:
        return f"the dot product does not add into {accumulator.name!r}"
    if any(name not in params for name in (grid.m, grid.n, k)):
        return "the sizes M, N and K are not kernel parameters"
    element = {text(params[p].child_by_field_name("type")) for p in (a, b) if p in params}
    if len(element) != 1 or element - {"float", "double"}:
        return f"{a} and {b} are not both float* or both double* parameters"
    taken = NEW_NAMES & (set(params) | {grid.row, grid.col, acc})
    if taken:
        return f"the name {sorted(taken)[0]!r} is taken"
    reason = _epilogue_reason(grid, grid.inner[2:])
    if reason is not None:
        return reason
    sizes = (grid.m, grid.n, k)
    return Matmul(
        grid.index_type,
        grid.row,
        grid.col,
        grid.flat,
        sizes,
        a,
        b,
        element.pop(),
        accumulator,
        grid.inner[2:],
    )


def _names(kernel: Node) -> dict[str, Node]:
    """The kernel's parameters by name."""
    found = {}
    for param in cxx_source.parameters(kernel):
        declarator = text(param.child_by_field_name("declarator"))
        found[declarator.split()[-1].lstrip("*")] = param
    return found


def _tiled_body(code: bytes, kernel: Node, mm: Matmul) -> str:
    """The kernel body staging TILE x TILE tiles of A and B through shared memory; tiles
    past the edges of A and B are filled with zeros, the store stays in bounds."""
    body = kernel.child_by_field_name("body")
    assert body is not None
    pad = indent_of(code, _statements(body)[0])
    t, row, col, (m, n, k), a, b = mm.index_type, mm.row, mm.col, mm.sizes, mm.a, mm.b
    zero = "0.0f" if mm.element == "float" else "0.0"
    acc = mm.accumulator.name
    store = (
        [f"{t} {mm.flat} = {row} * {n} + {col};"]
        if mm.flat and any(mentions(s, {mm.flat}) for s in mm.epilogue)
        else []
    )
    store += [text(s) for s in mm.epilogue]
    lines = [
        f"__shared__ {mm.element} tile_a[TILE][TILE];",
        f"__shared__ {mm.element} tile_b[TILE][TILE];",
        f"{t} {row} = blockIdx.y * TILE + threadIdx.y;",
        f"{t} {col} = blockIdx.x * TILE + threadIdx.x;",
        text(mm.accumulator.statement),
        f"for ({t} k0 = 0; k0 < {k}; k0 += TILE) {{",
        f"    {t} ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;",
        f"    tile_a[threadIdx.y][threadIdx.x] = {row} < {m} && ka < {k} ? {a}[{row} * {k} + ka]"
        f" : {zero};",
        f"    tile_b[threadIdx.y][threadIdx.x] = kb < {k} && {col} < {n} ? {b}[kb * {n} + {col}]"
        f" : {zero};",
        "    __syncthreads();",
        "    for (int k = 0; k < TILE; ++k) {",
        f"        {acc} += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];",
        "    }",
        "    __syncthreads();",
        "}",
        f"if ({row} < {m} && {col} < {n}) {{",
        *(f"    {line}" for line in store),
        "}",
    ]
    return "{" + "".join(f"\n{pad}{line}" for line in lines) + "\n}"


def _tile_definition(root: Node, kernel: Node) -> list[Edit] | str:
    """The edit defining TILE above `kernel`, none when the source's own TILE is 16 or 32."""
    known = cxx_source.constants(root).get("TILE")
    if known in ("16", "32"):
        return []
    if known is not None or any(text(n) == "TILE" for n in walk(root) if n.type == "identifier"):
        return "the source already names something TILE"
    return [(kernel.start_byte, kernel.start_byte, f"#define TILE {TILE}\n\n")]


def _launch_edits(code: bytes, root: Node, kernel: Node, mm: Matmul) -> list[Edit] | str:
    """Each launch gets a TILE x TILE block and a grid covering N columns and M rows."""
    calls = _launches_of(root, kernel)
    if not calls:
        return "its launch is not in this source, so its block cannot become TILE x TILE"
    position = {name: i for i, name in enumerate(_names(kernel))}
    edits: list[Edit] = []
    for call in calls:
        args = call.child_by_field_name("arguments")
        values = list(args.named_children) if args is not None else []
        if len(values) != len(position):
            return "a launch passes a different number of arguments than the kernel takes"
        m, n = (_grouped(values[position[size]]) for size in mm.sizes[:2])
        grid, block = cxx_source.launch_config(call)[:2]
        cover = f"dim3(({n} + TILE - 1) / TILE, ({m} + TILE - 1) / TILE)"
        edits.append((grid.start_byte, grid.end_byte, cover))
        edits.append((block.start_byte, block.end_byte, "dim3(TILE, TILE)"))
        edits += _dead_dim3(code, call, grid) + _dead_dim3(code, call, block)
    bounds = launch_bounds_literal(kernel)
    if bounds is not None:
        edits.append((bounds.start_byte, bounds.end_byte, "TILE * TILE"))
    return edits


def _dead_dim3(code: bytes, call: Node, config: Node) -> list[Edit]:
    """The edit deleting the line `dim3 name(...);` when the launch was its only use."""
    host = call.parent
    while host is not None and host.type != "function_definition":
        host = host.parent
    name = text(config) if config.type == "identifier" else ""
    uses = [n for n in walk(host) if n.type == "identifier" and text(n) == name] if host else []
    declaration = uses[0].parent.parent if len(uses) == 2 and uses[0].parent else None
    if (
        declaration is None
        or declaration.type != "declaration"
        or not text(declaration).startswith("dim3 ")
    ):
        return []
    start = code.rfind(b"\n", 0, declaration.start_byte) + 1
    end = declaration.end_byte + code[declaration.end_byte :].startswith(b"\n")
    return [(start, end, "")]


def _grouped(node: Node) -> str:
    return text(node) if node.type in ("identifier", "number_literal") else f"({text(node)})"


def _tile_kernel(code: bytes, root: Node, kernel: Node) -> Plan:
    if "__shared__" in text(kernel):
        return "it already uses shared memory"
    mm = _matmul(kernel)
    if isinstance(mm, str):
        return mm
    launch = _launch_edits(code, root, kernel, mm)
    body = kernel.child_by_field_name("body")
    if isinstance(launch, str) or body is None:
        return launch or "a kernel without a body"
    return [*launch, (body.start_byte, body.end_byte, _tiled_body(code, kernel, mm))]


def plan_smem_tiling(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons = []
    tiled = []
    for kernel in analysis.kernels(root):
        plan = _tile_kernel(code, root, kernel)
        if isinstance(plan, str):
            reasons.append(f"{cxx_source.function_name(kernel)}: {plan}")
        else:
            edits += plan
            tiled.append(kernel)
    if not tiled:
        return reasons[0] if reasons else "no __global__ kernel"
    definition = _tile_definition(root, tiled[0])
    return definition if isinstance(definition, str) else definition + edits


REWRITES = [
    Rewrite(
        "cuda.warp_shuffle_reduce",
        "cuda",
        "finish a shared-memory tree reduction (+, max, min) with warp shuffles below 64",
        lambda data: code_plan(data, "cuda", plan_warp_shuffle_reduce),
    ),
    Rewrite(
        "cuda.smem_tiling",
        "cuda",
        f"stage {TILE}x{TILE} tiles of A and B in shared memory in a naive matmul "
        "(launch retargeted to TILE x TILE blocks)",
        lambda data: code_plan(data, "cuda", plan_smem_tiling),
    ),
]
