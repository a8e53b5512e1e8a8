"""Mechanical CUDA rewrites: launch configuration, qualifiers, loops, vector loads, flags."""

from __future__ import annotations

import re
from collections.abc import Callable

from tree_sitter import Node

from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.base import (
    CodePlanner,
    Edit,
    Plan,
    Rewrite,
    code_plan,
    flag_plan,
    indent_of,
    insert_line_before,
)

TARGET_BLOCK = 256
RESTRICT = re.compile(r"__restrict(__)?\b")


def _constant_node(root: Node, name: str) -> Node | None:
    """The literal that defines the compile-time constant `name`."""
    for node in walk(root):
        if node.type == "preproc_def" and text(node.child_by_field_name("name")) == name:
            return node.child_by_field_name("value")
        if node.type == "init_declarator" and text(node.child_by_field_name("declarator")) == name:
            value = node.child_by_field_name("value")
            if value is not None and value.type == "number_literal":
                return value
    return None


def block_literal(root: Node, call: Node) -> Node | None:
    config = cxx_source.launch_config(call)
    if len(config) < 2:
        return None
    block = config[1]
    if block.type == "identifier":
        return _constant_node(root, text(block))
    return block if block.type == "number_literal" else None


def kernel_named(root: Node, name: str) -> Node | None:
    return next((fn for fn in analysis.kernels(root) if cxx_source.function_name(fn) == name), None)


def launch_bounds_literal(kernel: Node | None) -> Node | None:
    bounds = (
        next((c for c in kernel.children if c.type == "launch_bounds"), None) if kernel else None
    )
    return bounds.named_children[0] if bounds is not None and bounds.named_children else None


def plan_block_size(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons = []
    for call in cxx_source.launches(root):
        literal = block_literal(root, call)
        if literal is None or not text(literal).strip().isdigit():
            reasons.append("the block size is not a compile-time constant")
            continue
        old = int(text(literal).strip())
        if old == TARGET_BLOCK:
            reasons.append(f"the launch already uses {TARGET_BLOCK} threads per block")
            continue
        edit = _retarget_launch(root, call, literal, old)
        if isinstance(edit, str):
            reasons.append(edit)
        else:
            edits += edit
    return edits or (reasons[0] if reasons else "no kernel launch (`<<<...>>>`) found")


def _retarget_launch(root: Node, call: Node, literal: Node, old: int) -> Plan:
    edits: list[Edit] = [(literal.start_byte, literal.end_byte, str(TARGET_BLOCK))]
    grid = cxx_source.launch_config(call)[0]
    if cxx_source.launch_config(call)[1].type == "number_literal":
        numbers = [n for n in walk(grid) if n.type == "number_literal"]
        rounding = {str(old): str(TARGET_BLOCK), str(old - 1): str(TARGET_BLOCK - 1)}
        if not any(text(n) == str(old) for n in numbers):
            return "the grid size is not derived from the block size literal"
        edits += [
            (n.start_byte, n.end_byte, rounding[text(n)]) for n in numbers if text(n) in rounding
        ]
    bounds = launch_bounds_literal(kernel_named(root, text(call.child_by_field_name("function"))))
    if bounds is not None and text(bounds) == str(old):
        edits.append((bounds.start_byte, bounds.end_byte, str(TARGET_BLOCK)))
    return edits


def plan_restrict_const(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    for kernel in analysis.kernels(root):
        edits += pointer_qualifier_edits(kernel, const=True)
    if not analysis.kernels(root):
        return "no __global__ kernel"
    return edits or "every pointer parameter is already __restrict__ (and const where read-only)"


def pointer_qualifier_edits(fn: Node, const: bool) -> list[Edit]:
    """Add `__restrict__` to pointer parameters and, with `const`, `const` to the
    pointees that the function only reads through subscripts."""
    edits: list[Edit] = []
    body = fn.child_by_field_name("body")
    for param in cxx_source.parameters(fn):
        pointer = cxx_source.pointer_declarator(param)
        if pointer is None:
            continue
        if not RESTRICT.search(text(param)):
            star = pointer.children[0]
            edits.append((star.end_byte, star.end_byte, " __restrict__"))
        name = text(param.child_by_field_name("declarator")).split()[-1].lstrip("*")
        leading_const = param.children[0].type == "type_qualifier"
        if const and not leading_const and body is not None and _read_only(body, name):
            edits.append((param.start_byte, param.start_byte, "const "))
    return edits


def _read_only(body: Node, name: str) -> bool:
    """Every use of `name` is `name[...]` read, never written, never aliased."""
    written = {id(t.child_by_field_name("argument")) for t, _ in analysis.write_targets(body)}
    for node in walk(body):
        if node.type == "identifier" and text(node) == name:
            parent = node.parent
            if parent is None or parent.type != "subscript_expression":
                return False
            if parent.child_by_field_name("argument") != node or id(node) in written:
                return False
    return not any(
        t.type == "subscript_expression" and text(t.child_by_field_name("argument")) == name
        for t, _ in analysis.write_targets(body)
    )


def plan_pragma_unroll(code: bytes, root: Node) -> Plan:
    known = cxx_source.constants(root)
    edits: list[Edit] = []
    seen_fixed = False
    for kernel in analysis.kernels(root):
        for loop in cxx_source.loops(kernel):
            if not cxx_source.is_fixed_trip(loop, known):
                continue
            seen_fixed = True
            if not cxx_source.loop_pragma(loop) and analysis.in_compound(loop):
                edits.append(insert_line_before(code, loop, "#pragma unroll"))
    if edits:
        return edits
    return "every fixed-trip loop already has a pragma" if seen_fixed else "no fixed-trip loop"


def plan_launch_bounds(code: bytes, root: Node) -> Plan:
    sizes: dict[str, str] = {}
    for call in cxx_source.launches(root):
        literal = block_literal(root, call)
        if literal is not None:
            sizes[text(call.child_by_field_name("function"))] = text(literal).strip()
    edits: list[Edit] = []
    reasons = []
    for kernel in analysis.kernels(root):
        name = cxx_source.function_name(kernel)
        declarator = kernel.child_by_field_name("declarator")
        if any(c.type == "launch_bounds" for c in kernel.children):
            reasons.append(f"{name} already has __launch_bounds__")
        elif name not in sizes or declarator is None:
            reasons.append(f"{name} has no launch with a constant block size in this source")
        else:
            edits.append(
                (declarator.start_byte, declarator.start_byte, f"__launch_bounds__({sizes[name]}) ")
            )
    return edits or (reasons[0] if reasons else "no __global__ kernel")


def plan_grid_stride(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons = []
    for kernel in analysis.kernels(root):
        guard = analysis.thread_guard(kernel)
        if isinstance(guard, str):
            reasons.append(guard)
            continue
        header = (
            f"for ({guard.type} {guard.var} = {text(guard.index)}; {guard.var} < "
            f"{text(guard.bound)}; {guard.var} += blockDim.x * gridDim.x) "
        )
        edits.append(
            (guard.declaration.start_byte, guard.branch.end_byte, header + text(guard.body))
        )
    return edits or (reasons[0] if reasons else "no __global__ kernel")


COMPONENTS = ("x", "y", "z", "w")


def plan_vectorize_float4(code: bytes, root: Node) -> Plan:
    if re.search(r"\bfloat4\b", code.decode()):
        return "the source already uses float4"
    return plan_kernels(root, lambda kernel: _vectorize_kernel(code, root, kernel))


def plan_kernels(root: Node, plan_one: Callable[[Node], Plan]) -> Plan:
    """The edits `plan_one` makes to every `__global__` kernel, or the first one's reason."""
    edits: list[Edit] = []
    reasons = []
    for kernel in analysis.kernels(root):
        plan = plan_one(kernel)
        if isinstance(plan, str):
            reasons.append(f"{cxx_source.function_name(kernel)}: {plan}")
        else:
            edits += plan
    return edits or (reasons[0] if reasons else "no __global__ kernel")


def _float_pointers(kernel: Node) -> list[str] | str:
    names = []
    for param in cxx_source.parameters(kernel):
        if cxx_source.pointer_declarator(param) is None:
            continue
        if text(param.child_by_field_name("type")) != "float":
            return "a pointer parameter is not float*"
        names.append(text(param.child_by_field_name("declarator")).split()[-1].lstrip("*"))
    return names or "no float* parameters"


def _element_accesses(body: Node, pointers: list[str], var: str) -> list[Node] | str:
    """The `p[i]` subscripts of the pointers; a reason if a pointer is used otherwise."""
    accesses = []
    for node in walk(body):
        if node.type == "identifier" and text(node) in pointers:
            parent = node.parent
            index = parent.child_by_field_name("indices") if parent is not None else None
            if parent is None or parent.type != "subscript_expression" or text(index) != f"[{var}]":
                return f"{text(node)!r} is used other than as {text(node)}[{var}]"
            accesses.append(parent)
    return accesses or "the guarded body touches no pointer"


def _vectorize_kernel(code: bytes, root: Node, kernel: Node) -> Plan:
    guard = analysis.thread_guard(kernel)
    pointers = _float_pointers(kernel)
    if isinstance(guard, str) or isinstance(pointers, str):
        return guard if isinstance(guard, str) else str(pointers)
    accesses = _element_accesses(guard.body, pointers, guard.var)
    if isinstance(accesses, str):
        return accesses
    name = cxx_source.function_name(kernel)
    launches = cxx_source.launches(root)
    calls = [c for c in launches if text(c.child_by_field_name("function")) == name]
    if not calls:
        return "its launch is not in this source, so the grid cannot shrink by four"
    written = {
        text(t.child_by_field_name("argument"))
        for t, _ in analysis.write_targets(guard.body)
        if t.type == "subscript_expression"
    }
    used = sorted({text(a.child_by_field_name("argument")) for a in accesses})
    body = _vector_body(code, guard, accesses, used, written)
    edits: list[Edit] = [(guard.declaration.start_byte, guard.branch.end_byte, body)]
    for call in calls:
        grid = cxx_source.launch_config(call)[0]
        edits.append((grid.start_byte, grid.end_byte, f"(({text(grid)}) + 3) / 4"))
    return edits


def _substitute(body: Node, accesses: list[Node], component: str) -> str:
    """The body's text with each `p[i]` replaced by `p_v4.<component>`."""
    out = body.text or b""
    for access in sorted(accesses, key=lambda a: a.start_byte, reverse=True):
        start, end = access.start_byte - body.start_byte, access.end_byte - body.start_byte
        name = text(access.child_by_field_name("argument"))
        out = out[:start] + f"{name}_v4.{component}".encode() + out[end:]
    return out.decode()


def _reindent(block: str, extra: int) -> str:
    """Shift every line after the first right by `extra` spaces (nested deeper)."""
    return block.replace("\n", "\n" + " " * extra)


def _vector_body(
    code: bytes, guard: analysis.Guard, accesses: list[Node], used: list[str], written: set[str]
) -> str:
    pad = indent_of(code, guard.declaration)
    inner = pad + "    "
    t, i, n = guard.type, guard.var, text(guard.bound)
    address = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in used)
    lines = [
        f"{t} {i}_v4 = {text(guard.index)};",
        f"{pad}{t} {i}_base = {i}_v4 * 4;",
        f"{pad}if ({i}_base + 3 < {n} && (({address}) & 15ULL) == 0ULL) {{",
    ]
    for p in used:
        if p in written and not _loaded(accesses, p, written):
            lines.append(f"{inner}float4 {p}_v4;")
        else:
            lines.append(f"{inner}float4 {p}_v4 = reinterpret_cast<const float4*>({p})[{i}_v4];")
    for k, component in enumerate(COMPONENTS):
        lines.append(f"{inner}{{")
        lines.append(f"{inner}    {t} {i} = {i}_base + {k};")
        lines.append(f"{inner}    (void){i};")
        lines.append(f"{inner}    {_reindent(_substitute(guard.body, accesses, component), 8)}")
        lines.append(f"{inner}}}")
    lines += [f"{inner}reinterpret_cast<float4*>({p})[{i}_v4] = {p}_v4;" for p in sorted(written)]
    lines.append(f"{pad}}} else {{")
    tail = f"{i} < {n} && {i} < {i}_base + 4"
    body = _reindent(text(guard.body), 4)
    lines.append(f"{inner}for ({t} {i} = {i}_base; {tail}; ++{i}) {body}")
    lines.append(f"{pad}}}")
    return "\n".join(lines)


def _loaded(accesses: list[Node], pointer: str, written: set[str]) -> bool:
    """True when `pointer` is read anywhere (not only assigned with `=`)."""
    for access in accesses:
        if text(access.child_by_field_name("argument")) != pointer:
            continue
        parent = access.parent
        plain_store = (
            parent is not None
            and parent.type == "assignment_expression"
            and parent.child_by_field_name("left") == access
            and text(parent.child_by_field_name("operator")) == "="
        )
        if not plain_store:
            return True
    return False


def _code(planner: CodePlanner) -> Callable[[bytes], Plan]:
    return lambda data: code_plan(data, "cuda", planner)


REWRITES = [
    Rewrite(
        "cuda.block_size",
        "cuda",
        f"launch {TARGET_BLOCK} threads per block (grid and __launch_bounds__ follow)",
        _code(plan_block_size),
    ),
    Rewrite(
        "cuda.restrict_const",
        "cuda",
        "__restrict__ on kernel pointer parameters, const on those only read",
        _code(plan_restrict_const),
    ),
    Rewrite(
        "cuda.pragma_unroll",
        "cuda",
        "#pragma unroll on fixed-trip loops in kernels",
        _code(plan_pragma_unroll),
    ),
    Rewrite(
        "cuda.launch_bounds",
        "cuda",
        "__launch_bounds__(block size) on kernels launched with a constant block",
        _code(plan_launch_bounds),
    ),
    Rewrite(
        "cuda.grid_stride",
        "cuda",
        "turn `if (i < n)` one-thread-per-element kernels into grid-stride loops",
        _code(plan_grid_stride),
    ),
    Rewrite(
        "cuda.vectorize_float4",
        "cuda",
        "float4 loads/stores (four elements per thread) with an aligned check and scalar tail",
        _code(plan_vectorize_float4),
    ),
    Rewrite(
        "cuda.fast_math",
        "cuda",
        "compile with --use_fast_math (extra_cuda_cflags)",
        lambda data: flag_plan(data, "extra_cuda_cflags", ["--use_fast_math"], set()),
    ),
]
