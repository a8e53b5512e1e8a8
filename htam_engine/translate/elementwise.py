"""One C++ expression per elementwise aten op, over operands already written as C
(`x[i]`, `0.5f`): the writer puts it in a loop nest with the operands' indices.

Each entry takes the operands (positional, then keyword defaults the op fills in) and
the C type of the result; an op missing here is one the writer cannot yet write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Expression = Callable[[list[Any], str], str]


def _float(value: str, ctype: str) -> str:
    return f"static_cast<{ctype}>({value})"


def _clamp(low: Any, high: Any) -> Expression:
    def render(a: list[Any], t: str) -> str:
        value = a[0]
        if low is not None or (len(a) > 1 and a[1] is not None):
            bound = a[1] if len(a) > 1 and a[1] is not None else low
            value = f"std::max<{t}>({value}, {bound})"
        if high is not None or (len(a) > 2 and a[2] is not None):
            bound = a[2] if len(a) > 2 and a[2] is not None else high
            value = f"std::min<{t}>({value}, {bound})"
        return value

    return render


def _gelu(a: list[Any], t: str) -> str:
    x = a[0]
    if len(a) > 1 and a[1] == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return _float(f"0.5 * {x} * (1.0 + std::tanh({inner}))", t)
    return _float(f"0.5 * {x} * (1.0 + std::erf({x} * 0.7071067811865476))", t)


def _elu(a: list[Any], t: str) -> str:
    x = a[0]
    alpha, scale, input_scale = (list(a[1:]) + ["1", "1", "1"])[:3]
    negative = f"{alpha} * (std::exp({x} * {input_scale}) - 1)"
    return _float(f"{scale} * ({x} > 0 ? {x} : {negative})", t)


def _softplus(a: list[Any], t: str) -> str:
    x = a[0]
    beta, threshold = (list(a[1:]) + ["1", "20"])[:2]
    return _float(
        f"{x} * {beta} > {threshold} ? {x} : std::log1p(std::exp({x} * {beta})) / {beta}", t
    )


def _div(a: list[Any], t: str) -> str:
    quotient = f"{_float(a[0], t)} / {_float(a[1], t)}"
    mode = a[2] if len(a) > 2 else None
    if mode == "trunc":
        return f"std::trunc({quotient})"
    if mode == "floor":
        return f"std::floor({quotient})"
    return quotient


def _add(sign: str) -> Expression:
    def render(a: list[Any], t: str) -> str:
        alpha = a[2] if len(a) > 2 and a[2] is not None else None
        right = f"{alpha} * {a[1]}" if alpha not in (None, "1", "1.0f", "1.0") else a[1]
        return f"{a[0]} {sign} {right}"

    return render


def _call(function: str) -> Expression:
    return lambda a, t: f"{function}({a[0]})"


def _binary(operator: str) -> Expression:
    return lambda a, t: f"{a[0]} {operator} {a[1]}"


EXPRESSIONS: dict[str, Expression] = {
    "add": _add("+"),
    "sub": _add("-"),
    "rsub": lambda a, t: f"{a[1]} - {a[0]}",
    "mul": _binary("*"),
    "div": _div,
    "neg": lambda a, t: f"-{a[0]}",
    "abs": _call("std::abs"),
    "exp": _call("std::exp"),
    "exp2": _call("std::exp2"),
    "expm1": _call("std::expm1"),
    "log": _call("std::log"),
    "log2": _call("std::log2"),
    "log10": _call("std::log10"),
    "log1p": _call("std::log1p"),
    "sqrt": _call("std::sqrt"),
    "rsqrt": lambda a, t: _float(f"1.0 / std::sqrt({a[0]})", t),
    "reciprocal": lambda a, t: _float(f"1.0 / {a[0]}", t),
    "sin": _call("std::sin"),
    "cos": _call("std::cos"),
    "tan": _call("std::tan"),
    "tanh": _call("std::tanh"),
    "erf": _call("std::erf"),
    "floor": _call("std::floor"),
    "ceil": _call("std::ceil"),
    "round": _call("std::nearbyint"),
    "trunc": _call("std::trunc"),
    "sign": lambda a, t: _float(f"({a[0]} > 0) - ({a[0]} < 0)", t),
    "sigmoid": lambda a, t: _float(f"1.0 / (1.0 + std::exp(-{a[0]}))", t),
    "relu": lambda a, t: f"{a[0]} > 0 ? {a[0]} : {_float('0', t)}",
    "leaky_relu": lambda a, t: f"{a[0]} > 0 ? {a[0]} : {a[0]} * {a[1] if len(a) > 1 else '0.01'}",
    "gelu": _gelu,
    "elu": _elu,
    "softplus": _softplus,
    "silu": lambda a, t: _float(f"{a[0]} / (1.0 + std::exp(-{a[0]}))", t),
    "mish": lambda a, t: _float(f"{a[0]} * std::tanh(std::log1p(std::exp({a[0]})))", t),
    "hardsigmoid": lambda a, t: _float(f"std::min(std::max({a[0]} + 3.0, 0.0), 6.0) / 6.0", t),
    "hardswish": lambda a, t: _float(
        f"{a[0]} * std::min(std::max({a[0]} + 3.0, 0.0), 6.0) / 6.0", t
    ),
    "hardtanh": _clamp(-1, 1),
    "clamp": _clamp(None, None),
    "clamp_min": _clamp(None, None),
    "clamp_max": lambda a, t: f"std::min<{t}>({a[0]}, {a[1]})",
    "maximum": lambda a, t: f"std::max<{t}>({a[0]}, {a[1]})",
    "minimum": lambda a, t: f"std::min<{t}>({a[0]}, {a[1]})",
    "pow": lambda a, t: _float(f"std::pow({a[0]}, {a[1]})", t),
    "atan2": lambda a, t: f"std::atan2({a[0]}, {a[1]})",
    "fmod": lambda a, t: f"std::fmod({a[0]}, {a[1]})",
    "remainder": lambda a, t: f"{a[0]} - std::floor({_float(a[0], t)} / {a[1]}) * {a[1]}",
    "threshold": lambda a, t: f"{a[0]} > {a[1]} ? {a[0]} : {_float(a[2], t)}",
    "eq": _binary("=="),
    "ne": _binary("!="),
    "lt": _binary("<"),
    "le": _binary("<="),
    "gt": _binary(">"),
    "ge": _binary(">="),
    "logical_not": lambda a, t: f"!{a[0]}",
    "bitwise_not": lambda a, t: f"!{a[0]}" if t == "bool" else f"~{a[0]}",
    "logical_and": _binary("&&"),
    "logical_or": _binary("||"),
    "bitwise_and": _binary("&"),
    "bitwise_or": _binary("|"),
    "isnan": _call("std::isnan"),
    "where": lambda a, t: f"{a[0]} ? {_float(a[1], t)} : {_float(a[2], t)}",
    "clone": lambda a, t: a[0],
    "_to_copy": lambda a, t: _float(a[0], t),
}
