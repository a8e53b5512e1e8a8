"""Mechanical Triton rewrites: launch settings (warps, stages), block sizes, an autotune
config set, a GROUP_M program swizzle. They edit the Python file itself: the
`@triton.jit` kernels and their `kernel[grid](...)` launches."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import text, triton_source
from htam_engine.parsing.triton_source import Kernel, Launch, grid_code, kernels
from htam_engine.strategies.base import Edit, Plan, Rewrite, indent_of

WARPS = 8  # num_warps for a tile kernel launched with the default 4
STAGES = 4  # num_stages for a K loop (the default is 3 on NVIDIA GPUs)
GROUP_M = 8  # rows of tiles that share B tiles in L2
MAX_BLOCK_1D = 8192  # elements a one-dimensional program may hold after doubling
MAX_TILE = 2**19  # elements of a multi-dimensional tile (product of its BLOCKs)


def _hard_coded(launch: Launch, values: dict[str, int]) -> str | None:
    """Why the grid would not follow new values of `values` (it repeats a literal)."""
    grid = text(grid_code(launch))
    for name, value in values.items():
        if re.search(rf"(?<![\w.]){value}(?![\w.])", grid):
            return f"the grid hard-codes {name}={value}: derive it from meta (lambda meta: ...)"
    return None


def _append_keywords(launch: Launch, pairs: dict[str, str]) -> Edit:
    """Insert `, k=v` after a launch's last argument."""
    last = launch.arguments.named_children[-1]
    added = "".join(f", {k}={v}" for k, v in pairs.items())
    return (last.end_byte, last.end_byte, added)


def _plan_kernels(data: bytes, plan_one: Callable[[bytes, Kernel], Plan]) -> Plan:
    """Run `plan_one` on every kernel that is launched in this file; applies when one
    yields edits, else gives the first reason."""
    found = kernels(parsing.parse(data, "python").root_node)
    if not found:
        return "no @triton.jit kernel in this file"
    launched = [k for k in found if k.launches]
    if not launched:
        return "no kernel[grid](...) launch in this file"
    edits: list[Edit] = []
    reasons: list[str] = []
    for kernel in launched:
        plan = plan_one(data, kernel)
        if isinstance(plan, str):
            reasons.append(f"{kernel.name}: {plan}")
        else:
            edits += plan
    return edits or reasons[0]


# --- launch settings -------------------------------------------------------------------


def _setting_planner(keyword: str, value: int, needs_loop: bool) -> Callable[[bytes, Kernel], Plan]:
    def plan(data: bytes, kernel: Kernel) -> Plan:
        if kernel.autotuned:
            return f"autotuned: {keyword} belongs in its configs"
        if needs_loop and not _dot_loops(kernel):
            return f"no loop over K around a tl.dot for {keyword} to pipeline"
        edits = [
            _append_keywords(launch, {keyword: str(value)})
            for launch in kernel.launches
            if keyword not in launch.keywords
        ]
        return edits or f"every launch already sets {keyword}"

    return plan


def _dot_loops(kernel: Kernel) -> list[Node]:
    dots = {call.id for name, call in triton_source.tl_calls(kernel.decorated) if name == "dot"}
    return [
        loop
        for loop in parsing.walk(kernel.decorated)
        if loop.type in ("for_statement", "while_statement")
        and any(n.id in dots for n in parsing.walk(loop))
    ]


# --- block sizes -----------------------------------------------------------------------


def doubled(blocks: dict[str, int]) -> dict[str, int]:
    """Each BLOCK doubled, in launch order, while the program's tile stays bounded."""
    limit = MAX_BLOCK_1D if len(blocks) == 1 else MAX_TILE
    result = dict(blocks)
    for name, value in blocks.items():
        product = 1
        for other in result.values():
            product *= other
        if product * 2 <= limit:
            result[name] = value * 2
    return result


def _block_plan(data: bytes, kernel: Kernel) -> Plan:
    if kernel.autotuned:
        return "autotuned: block sizes belong in its configs"
    edits: list[Edit] = []
    for launch in kernel.launches:
        blocks = kernel.blocks(launch)
        if not blocks:
            return "no BLOCK constexpr passed as an integer literal at launch"
        bigger = doubled(blocks)
        if bigger == blocks:
            return f"blocks {blocks} are already at the size limit"
        problem = _hard_coded(launch, blocks)
        if problem:
            return problem
        edits += [
            (launch.keywords[name].start_byte, launch.keywords[name].end_byte, str(value))
            for name, value in bigger.items()
            if value != blocks[name]
        ]
    return edits


# --- autotune --------------------------------------------------------------------------


def _config(blocks: dict[str, int], warps: int, stages: str | None) -> str:
    settings = f", num_warps={warps}" + (f", num_stages={stages}" if stages else "")
    return f"triton.Config({json.dumps(blocks)}{settings})"


def _autotune_decorator(kernel: Kernel, launch: Launch, indent: str) -> str:
    blocks = kernel.blocks(launch)
    warps = launch.keywords.get("num_warps")
    base_warps = int(text(warps)) if warps is not None and text(warps).isdigit() else 4
    stages_node = launch.keywords.get("num_stages")
    stages = text(stages_node) if stages_node is not None else None
    variants = [(blocks, base_warps), (blocks, base_warps * 2)]
    variants += [(doubled(blocks), base_warps), (doubled(blocks), base_warps * 2)]
    configs = list(dict.fromkeys(_config(b, w, stages) for b, w in variants))
    key = [name for name in kernel.plain if not re.search(r"ptr|stride", name)]
    lines = [f"{indent}    configs=[", *(f"{indent}        {c}," for c in configs)]
    lines += [f"{indent}    ],", f"{indent}    key={json.dumps(key)},", f"{indent})"]
    return "@triton.autotune(\n" + "\n".join(lines) + f"\n{indent}"


def _remove_keywords(launch: Launch, names: set[str]) -> list[Edit] | str:
    """Edits deleting `, name=value` for each of `names` present in the launch."""
    edits: list[Edit] = []
    for arg in launch.arguments.named_children:
        if arg.type == "keyword_argument" and text(arg.child_by_field_name("name")) in names:
            previous = arg.prev_named_sibling
            if previous is None:
                return "a tuned setting is the launch's first argument"
            edits.append((previous.end_byte, arg.end_byte, ""))
    return edits


def _autotune_plan(data: bytes, kernel: Kernel) -> Plan:
    if kernel.autotuned:
        return "already autotuned"
    launches = kernel.launches
    blocks = [kernel.blocks(launch) for launch in launches]
    if not blocks[0]:
        return "no BLOCK constexpr passed as an integer literal at launch"
    if any(b != blocks[0] for b in blocks):
        return "launches pass different block sizes"
    problem = next((p for launch in launches if (p := _hard_coded(launch, blocks[0]))), None)
    if problem:
        return problem
    tuned = {*blocks[0], "num_warps", "num_stages"}
    edits: list[Edit] = []
    for launch in launches:
        removal = _remove_keywords(launch, tuned)
        if isinstance(removal, str):
            return removal
        edits += removal
    indent = indent_of(data, kernel.decorated)
    decorator = _autotune_decorator(kernel, launches[0], indent)
    return [(kernel.decorated.start_byte, kernel.decorated.start_byte, decorator), *edits]


# --- GROUP_M swizzle ---------------------------------------------------------------------


@dataclass(frozen=True)
class RowMajorIds:
    """`pid_m = pid // grid_n` and `pid_n = pid % grid_n` in a kernel body."""

    pid_m: str
    pid_n: str
    grid_n: str
    last: Node  # the later of the two statements


def _split(assignment: Node, operator: str) -> tuple[str, str, str] | None:
    """(target, dividend, divisor) of `target = dividend <operator> divisor`."""
    left, right = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
    if left is None or right is None or right.type != "binary_operator":
        return None
    op = right.child_by_field_name("operator")
    a, b = right.child_by_field_name("left"), right.child_by_field_name("right")
    if text(op) != operator or a is None or b is None:
        return None
    if a.type != "identifier" or b.type != "identifier":
        return None
    return text(left), text(a), text(b)


def row_major_ids(kernel: Kernel) -> RowMajorIds | None:
    """The row-major program-id split of a tile kernel, if it has one."""
    assignments = [n for n in parsing.walk(kernel.decorated) if n.type == "assignment"]
    divisions = [(n, s) for n in assignments if (s := _split(n, "//"))]
    remainders = [(n, s) for n in assignments if (s := _split(n, "%"))]
    for first, (pid_m, pid, grid_n) in divisions:
        for second, (pid_n, pid2, grid_n2) in remainders:
            if (pid, grid_n) == (pid2, grid_n2):
                last = max(first, second, key=lambda n: n.start_byte)
                return RowMajorIds(pid_m, pid_n, grid_n, last.parent or last)
    return None


def _group_plan(data: bytes, kernel: Kernel) -> Plan:
    if not any(name == "dot" for name, _ in triton_source.tl_calls(kernel.decorated)):
        return "no tl.dot: program order matters for tile reuse only"
    if any("GROUP" in name for name in kernel.constexprs):
        return "already grouped"
    ids = row_major_ids(kernel)
    if ids is None:
        return "no `pid // grid_n`, `pid % grid_n` program-id split to swizzle"
    grid_m = f"tl.num_programs(0) // {ids.grid_n}"
    swizzle = f"{ids.pid_m}, {ids.pid_n} = tl.swizzle2d({ids.pid_m}, {ids.pid_n}, {grid_m}"
    line = f"\n{indent_of(data, ids.last)}{swizzle}, {ids.grid_n}, GROUP_M)"
    last_param = kernel.parameters.named_children[-1]
    edits: list[Edit] = [
        (ids.last.end_byte, ids.last.end_byte, line),
        (last_param.end_byte, last_param.end_byte, ", GROUP_M: tl.constexpr"),
    ]
    edits += [_append_keywords(launch, {"GROUP_M": str(GROUP_M)}) for launch in kernel.launches]
    return edits


def _planner(plan_one: Callable[[bytes, Kernel], Plan]) -> Callable[[bytes], Plan]:
    return lambda data: _plan_kernels(data, plan_one)


REWRITES = [
    Rewrite(
        "triton.num_warps",
        "triton",
        f"num_warps={WARPS} on launches that use the default",
        _planner(_setting_planner("num_warps", WARPS, needs_loop=False)),
    ),
    Rewrite(
        "triton.num_stages",
        "triton",
        f"num_stages={STAGES} on launches of kernels with a tl.dot K loop",
        _planner(_setting_planner("num_stages", STAGES, needs_loop=True)),
    ),
    Rewrite(
        "triton.block_size",
        "triton",
        "double the BLOCK constexprs passed at launch (the grid follows through meta)",
        _planner(_block_plan),
    ),
    Rewrite(
        "triton.autotune",
        "triton",
        "@triton.autotune over the launch's blocks and their doubles at two warp counts",
        _planner(_autotune_plan),
    ),
    Rewrite(
        "triton.group_m",
        "triton",
        f"GROUP_M={GROUP_M} program swizzle (tl.swizzle2d) for L2 reuse of tiles",
        _planner(_group_plan),
    ),
]
