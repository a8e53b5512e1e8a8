"""Ops that compute nothing, written as torch layout ops in forward: views, permutes
(then `contiguous`, so every C++ function reads a contiguous buffer), casts, constants."""

from __future__ import annotations

from typing import Any

from torch import fx

from htam_engine.translate.kernels import arguments
from htam_engine.translate.writer import CannotTranslate, Writer, py_literal, val

_HUGE = 2**62


def _view_shape(x: str, before: list[int], after: list[int]) -> str:
    """`after` in terms of `x`'s run-time dims when each of its dims merges whole dims of
    `x`; else (a dim split) the traced sizes with the largest left to `-1`."""
    out: list[str] = []
    k = 0
    for size in after:
        if size == 1:
            out.append("1")
            k += 1 if k < len(before) and before[k] == 1 else 0
            continue
        start, product = k, 1
        while k < len(before) and product < size:
            product, k = product * before[k], k + 1
        if product != size or k == start:
            largest = after.index(max(after))
            out = [str(-1 if m == largest else s) for m, s in enumerate(after)]
            break
        out.append(" * ".join(f"{x}.shape[{d}]" for d in range(start, k)))
    return f"({out[0]},)" if len(out) == 1 else f"({', '.join(out)})"


def view(w: Writer, node: fx.Node, op: str) -> None:
    values = arguments(node)
    x = w.var(values[0])
    name = w.bind(node, node.name)
    if op in ("view", "_unsafe_view", "reshape"):
        shape = _view_shape(x, list(val(values[0]).shape), list(val(node).shape))
        w.line(f"{name} = {x}.reshape{shape}")
    elif op == "unsqueeze":
        w.line(f"{name} = {x}.unsqueeze({values[1]})")
    elif op == "squeeze":
        dims = values[1] if len(values) > 1 and values[1] is not None else ""
        w.line(f"{name} = {x}.squeeze({tuple(dims) if isinstance(dims, list) else dims})")
    elif op in ("permute", "transpose", "t"):
        extra = (
            ", ".join(str(v) for v in values[1:3])
            if op == "transpose"
            else (str(list(values[1])) if op == "permute" else "")
        )
        w.line(f"{name} = {x}.{op}({extra}).contiguous()")
    elif op == "expand":
        before, after = list(val(values[0]).shape), list(val(node).shape)
        lead = len(after) - len(before)
        sizes = [
            -1 if k >= lead and before[k - lead] == after[k] else after[k]
            for k in range(len(after))
        ]
        w.line(f"{name} = {x}.expand({sizes}).contiguous()")
    elif op == "select":
        w.line(f"{name} = {x}.select({values[1]}, {values[2]}).contiguous()")
    elif op == "slice":
        dim, start, end, step = values[1:5]
        end = None if end is None or end >= _HUGE else end
        index = ":, " * (dim % len(val(values[0]).shape))
        w.line(
            f"{name} = {x}[{index}{start or ''}:{'' if end is None else end}:{step}].contiguous()"
        )
    else:
        raise CannotTranslate(f"aten.{op}")


def alias(w: Writer, node: fx.Node, op: str) -> None:
    """An op whose result is its input's values: the same buffer."""
    w.names[node.name] = w.var(node.args[0])  # type: ignore[arg-type]


def cast(w: Writer, node: fx.Node, op: str) -> None:
    name = w.bind(node, node.name)
    w.line(f"{name} = {w.var(node.args[0])}.to({val(node).dtype})")  # type: ignore[arg-type]


def constant(w: Writer, node: fx.Node, op: str) -> None:
    """`scalar_tensor`, `full`, `full_like`: torch fills them (no computation)."""
    values: list[Any] = arguments(node)
    name = w.bind(node, node.name)
    dtype = val(node).dtype
    if op == "full_like":
        fill = py_literal(values[1])
        w.line(f"{name} = torch.full_like({w.var(values[0])}, {fill}, dtype={dtype})")
    elif op == "scalar_tensor":
        w.line(f"{name} = torch.full((), {py_literal(values[0])}, dtype={dtype})")
    else:
        w.line(f"{name} = torch.full({tuple(values[0])}, {py_literal(values[1])}, dtype={dtype})")
