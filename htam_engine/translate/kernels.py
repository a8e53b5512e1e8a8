"""The loop nests, one writer per op family: elementwise (with broadcasting), reductions
over dims, one-dim scans (softmax, log-softmax, cumsum), normalizations, matmuls,
pooling and convolution. Each writes one C++ function and the forward lines that
allocate its outputs and call it with sizes read from the tensors at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from htam_engine.translate.elementwise import EXPRESSIONS
from htam_engine.translate.writer import CannotTranslate, Writer, ctype, ctype_of, literal, val

Emit = Callable[[Writer, fx.Node, str], None]
SPATIAL = {1: ["l"], 2: ["h", "w"], 3: ["d", "h", "w"]}


def arguments(node: fx.Node) -> list[Any]:
    """The op's arguments in its schema's order, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    values = []
    for k, argument in enumerate(schema.arguments):
        if k < len(node.args):
            values.append(node.args[k])
        elif argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        else:
            values.append(argument.default_value if argument.has_default_value() else None)
    return values


def nest(loops: Sequence[tuple[str, str]], body: Sequence[str], depth: int = 1) -> list[str]:
    """`for` loops over (index, bound) pairs around `body`, indented from `depth`."""
    pad = "    "
    head = [
        pad * (depth + k) + f"for (long {i} = 0; {i} < {n}; ++{i}) {{"
        for k, (i, n) in enumerate(loops)
    ]
    tail = [pad * (depth + k) + "}" for k in reversed(range(len(loops)))]
    return [*head, *(pad * (depth + len(loops)) + line for line in body), *tail]


def horner(indices: Sequence[str | None], dims: Sequence[str]) -> str:
    """A row-major flat index; a None index is a broadcast (size-1) dim."""
    expression = ""
    for index, dim in zip(indices, dims, strict=True):
        if index is None:
            continue
        expression = (
            f"({expression}) * {dim} + {index}"
            if "+" in expression
            else (f"{expression} * {dim} + {index}" if expression else index)
        )
    return expression or "0"


def broadcast_index(
    shape: Sequence[int], out: Sequence[int], names: Sequence[str], dims: Sequence[str]
) -> str:
    """The flat index into an operand of `shape` broadcast to `out`."""
    lead = len(out) - len(shape)
    indices = [
        None if k < lead or (shape[k - lead] == 1 and out[k] != 1) else names[k]
        for k in range(len(out))
    ]
    return horner(indices, dims)


def _rendered(value: Any, result_type: str) -> Any:
    if isinstance(value, bool | int | float):
        return literal(value, result_type)
    return value if isinstance(value, str) else None


def elementwise(w: Writer, node: fx.Node, op: str) -> None:
    out_shape, t = list(val(node).shape), ctype(node)
    values = arguments(node)
    tensors = [v for v in values if isinstance(v, fx.Node)]
    flat = all(list(val(v).shape) == out_shape for v in tensors)
    names, dims = [f"i{k}" for k in range(len(out_shape))], [f"d{k}" for k in range(len(out_shape))]
    params: list[tuple[str, str]] = []
    rendered = []
    for value in values:
        if not isinstance(value, fx.Node):
            rendered.append(_rendered(value, t))
            continue
        name = w.var(value)
        if (f"const {ctype(value)}*", name) not in params:
            params.append((f"const {ctype(value)}*", name))
        index = "i" if flat else broadcast_index(list(val(value).shape), out_shape, names, dims)
        rendered.append(f"{name}[{index}]")
    shapes = sorted({w.var(v) for v in tensors})
    shape = (
        f"{shapes[0]}.shape" if flat else f"_broadcast({', '.join(s + '.shape' for s in shapes)})"
    )
    out = w.alloc(node, shape)
    expression = EXPRESSIONS[op](rendered, t)
    pointers = [f"{name}.data_ptr()" for _, name in params] + [f"{out}.data_ptr()"]
    if flat:
        body = nest([("i", "n")], [f"out[i] = {expression};"])
        w.kernel(out, [*params, (f"{t}*", "out"), ("long", "n")], body)
        w.call(out, [*pointers, f"{out}.numel()"])
        return
    body = nest(
        list(zip(names, dims, strict=True)), [f"out[{horner(names, dims)}] = {expression};"]
    )
    w.kernel(out, [*params, (f"{t}*", "out"), *(("long", d) for d in dims)], body)
    w.call(out, [*pointers, f"*{out}.shape"])


# -- reductions ---------------------------------------------------------------------


def _reduced_dims(dim: Any, rank: int) -> list[int]:
    if dim is None or dim == []:
        return list(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(d % rank for d in dims)


def _lowest(t: str, sign: str) -> str:
    if t in ("float", "double"):
        return f"{sign}INFINITY"
    return f"std::numeric_limits<{t}>::{'lowest' if sign == '-' else 'max'}()"


def _reduction(op: str, values: list[Any], t: str) -> tuple[str, str, list[str], list[str]]:
    """(accumulator type, initial value, update lines, results) of reduction `op`;
    `v` is the element, `at` the index along the one reduced dim."""
    if op in ("sum", "mean", "prod"):
        update = "acc *= v;" if op == "prod" else "acc += v;"
        return (
            "double",
            "1.0" if op == "prod" else "0.0",
            [update],
            ["acc / count" if op == "mean" else "acc"],
        )
    if op in ("amax", "amin", "max", "min", "argmax", "argmin"):
        better = ">" if op in ("amax", "max", "argmax") else "<"
        tracked = op in ("max", "min", "argmax", "argmin")
        steps = [f"if (v {better} acc) {{", "    acc = v;", "    at = j;" if tracked else "", "}"]
        results = {"max": ["acc", "at"], "min": ["acc", "at"], "argmax": ["at"], "argmin": ["at"]}
        return (
            t,
            _lowest(t, "-" if better == ">" else "+"),
            [u for u in steps if u],
            results.get(op, ["acc"]),
        )
    if op == "any":
        return "bool", "false", ["acc = acc || v;"], ["acc"]
    if op == "linalg_vector_norm":
        order = values[1]
        if order == 2:
            return "double", "0.0", ["acc += v * v;"], ["std::sqrt(acc)"]
        if order == 1:
            return "double", "0.0", ["acc += std::abs(v);"], ["acc"]
        if order == float("inf"):
            return "double", "0.0", ["acc = std::max<double>(acc, std::abs(v));"], ["acc"]
        return (
            "double",
            "0.0",
            [f"acc += std::pow(std::abs(v), {order});"],
            [f"std::pow(acc, 1.0 / {order})"],
        )
    raise CannotTranslate(f"aten.{op}")


def reduce(w: Writer, node: fx.Node, op: str) -> None:
    """One accumulator per output: loops over the kept dims outside, the reduced inside."""
    values = arguments(node)
    source = values[0]
    rank = len(val(source).shape)
    dim = values[2] if op == "linalg_vector_norm" else values[1] if len(values) > 1 else None
    keepdim = next((v for v in values[2:4] if isinstance(v, bool)), False)
    if op in ("argmax", "argmin") and dim is None:
        raise CannotTranslate(f"aten.{op}", "over all elements")
    reduced = _reduced_dims(dim, rank)
    if op in ("max", "min", "argmax", "argmin") and len(reduced) != 1:
        raise CannotTranslate(f"aten.{op}", "over several dims")
    x, t = w.var(source), ctype(source)
    acc_type, init, update, results = _reduction(op, values, t)
    dims = [f"d{k}" for k in range(rank)]
    names = [
        ("j" if len(reduced) == 1 else f"j{k}") if k in reduced else f"i{k}" for k in range(rank)
    ]
    kept = [k for k in range(rank) if k not in reduced]
    out_index = horner([names[k] for k in kept], [dims[k] for k in kept])
    multi = len(results) > 1
    outs = [
        w.alloc(node, f"_reduced({x}.shape, {reduced}, {keepdim})", k if multi else None)
        for k in range(len(results))
    ]
    out_types = [ctype_of(val(node)[k] if multi else val(node)) for k in range(len(results))]
    inner = nest(
        [(names[k], dims[k]) for k in reduced],
        [f"const {t} v = {x}[{horner(names, dims)}];", *update],
        depth=0,
    )
    body = [
        f"{acc_type} acc = {init};",
        *(["long at = 0;"] if "at" in results else []),
        *inner,
        *(
            f"{p}[{out_index}] = static_cast<{ot}>({r});"
            for p, ot, r in zip(
                [f"out{k}" if multi else "out" for k in range(len(outs))],
                out_types,
                results,
                strict=True,
            )
        ),
    ]
    count = f"    const long count = {' * '.join(dims[k] for k in reduced)};"
    code = [count] * (op == "mean") + nest([(names[k], dims[k]) for k in kept], body)
    out_params = [(f"{ot}*", f"out{k}" if multi else "out") for k, ot in enumerate(out_types)]
    w.kernel(outs[0], [(f"const {t}*", x), *out_params, *(("long", d) for d in dims)], code)
    w.call(outs[0], [f"{x}.data_ptr()", *(f"{o}.data_ptr()" for o in outs), f"*{x}.shape"])


# -- one-dim scans: softmax, log-softmax, cumsum, cumprod ------------------------------

AT = "(o * size + j) * inner + p"


def _scan_body(op: str, x: str, t: str) -> list[str]:
    along = [("j", "size")]
    if op in ("cumsum", "cumprod"):
        update = "acc *= " if op == "cumprod" else "acc += "
        return [
            f"double acc = {'1.0' if op == 'cumprod' else '0.0'};",
            *nest(along, [f"{update}{x}[{AT}];", f"out[{AT}] = static_cast<{t}>(acc);"], 0),
        ]
    high = [f"{t} m = -INFINITY;", *nest(along, [f"m = std::max<{t}>(m, {x}[{AT}]);"], 0)]
    if op == "_log_softmax":
        return [
            *high,
            "double s = 0.0;",
            *nest(along, [f"s += std::exp({x}[{AT}] - m);"], 0),
            "const double log_s = std::log(s);",
            *nest(along, [f"out[{AT}] = static_cast<{t}>({x}[{AT}] - m - log_s);"], 0),
        ]
    return [
        *high,
        "double s = 0.0;",
        *nest(along, [f"out[{AT}] = std::exp({x}[{AT}] - m);", f"s += out[{AT}];"], 0),
        *nest(along, [f"out[{AT}] = static_cast<{t}>(out[{AT}] / s);"], 0),
    ]


def scan(w: Writer, node: fx.Node, op: str) -> None:
    """Along one dim of an (outer, size, inner) view: o and p pick the line, j walks it."""
    values = arguments(node)
    source = values[0]
    dim = values[1] % max(1, len(val(source).shape))
    x, t = w.var(source), ctype(node)
    out = w.alloc(node, f"{x}.shape")
    body = nest([("o", "outer"), ("p", "inner")], _scan_body(op, x, t))
    params = [(f"const {ctype(source)}*", x), (f"{t}*", "out")]
    w.kernel(out, [*params, ("long", "outer"), ("long", "size"), ("long", "inner")], body)
    w.call(out, [f"{x}.data_ptr()", f"{out}.data_ptr()", f"*_split({x}.shape, {dim}, {dim + 1})"])


# -- normalizations -----------------------------------------------------------------


def _affine(weight: Any, bias: Any, channel: str) -> str:
    scaled = f" * weight[{channel}]" if isinstance(weight, fx.Node) else ""
    return scaled + (f" + bias[{channel}]" if isinstance(bias, fx.Node) else "")


def _moments(x: str, loops: list[tuple[str, str]], at: str, count: str) -> list[str]:
    """`mean` and `var` (biased) of x[at] over `loops`, in double."""
    return [
        "double mean = 0.0;",
        *nest(loops, [f"mean += {x}[{at}];"], 0),
        f"mean /= {count};",
        "double var = 0.0;",
        *nest(
            loops, [f"const double centered = {x}[{at}] - mean;", "var += centered * centered;"], 0
        ),
        f"var /= {count};",
    ]


def _weights(w: Writer, weight: Any, bias: Any) -> tuple[list[tuple[str, str]], list[str]]:
    params, pointers = [], []
    for role, value in (("weight", weight), ("bias", bias)):
        if isinstance(value, fx.Node):
            params.append((f"const {ctype(value)}*", role))
            pointers.append(f"{w.var(value)}.data_ptr()")
    return params, pointers


def layer_norm(w: Writer, node: fx.Node, op: str) -> None:
    source, shape, weight, bias, eps = arguments(node)[:5]
    x, t = w.var(source), ctype(source)
    axis = len(val(source).shape) - len(shape)
    out = w.alloc(node, f"{x}.shape", 0)
    stats = [w.alloc(node, f"(*{x}.shape[:{axis}],) + (1,) * {len(shape)}", k) for k in (1, 2)]
    at = "r * cols + c"
    body = [
        *_moments(x, [("c", "cols")], at, "cols"),
        f"const double rstd = 1.0 / std::sqrt(var + {literal(eps, 'double')});",
        *nest(
            [("c", "cols")],
            [
                f"out[{at}] = static_cast<{t}>(({x}[{at}] - mean) * rstd"
                f"{_affine(weight, bias, 'c')});"
            ],
            0,
        ),
        "mean_out[r] = mean;",
        "rstd_out[r] = rstd;",
    ]
    params, pointers = _weights(w, weight, bias)
    w.kernel(
        out,
        [
            (f"const {t}*", x),
            *params,
            (f"{t}*", "out"),
            (f"{t}*", "mean_out"),
            (f"{t}*", "rstd_out"),
            ("long", "rows"),
            ("long", "cols"),
        ],
        nest([("r", "rows")], body),
    )
    w.call(
        out,
        [
            f"{x}.data_ptr()",
            *pointers,
            *(f"{o}.data_ptr()" for o in [out, *stats]),
            f"_product({x}.shape[:{axis}])",
            f"_product({x}.shape[{axis}:])",
        ],
    )


def batch_norm(w: Writer, node: fx.Node, op: str) -> None:
    """Per channel (dim 1): the batch's moments in training mode, else the running ones."""
    source, weight, bias, running_mean, running_var, training, _, eps = arguments(node)[:8]
    x, t = w.var(source), ctype(source)
    if not training and not isinstance(running_mean, fx.Node):
        raise CannotTranslate("aten.native_batch_norm", "no running statistics")
    out = w.alloc(node, f"{x}.shape", 0)
    stats = [w.alloc(node, f"({x}.shape[1],)", k) for k in (1, 2)]
    at = "(n * channels + c) * inner + p"
    loops = [("n", "batch"), ("p", "inner")]
    moments = (
        _moments(x, loops, at, "(batch * inner)")
        if training
        else ["const double mean = running_mean[c];", "const double var = running_var[c];"]
    )
    body = [
        *moments,
        f"const double invstd = 1.0 / std::sqrt(var + {literal(eps, 'double')});",
        *nest(
            loops,
            [
                f"out[{at}] = static_cast<{t}>(({x}[{at}] - mean) * invstd"
                f"{_affine(weight, bias, 'c')});"
            ],
            0,
        ),
        "mean_out[c] = mean;",
        "invstd_out[c] = invstd;",
    ]
    params, pointers = _weights(w, weight, bias)
    if not training:
        params += [(f"const {t}*", "running_mean"), (f"const {t}*", "running_var")]
        pointers += [f"{w.var(running_mean)}.data_ptr()", f"{w.var(running_var)}.data_ptr()"]
    w.kernel(
        out,
        [
            (f"const {t}*", x),
            *params,
            (f"{t}*", "out"),
            (f"{t}*", "mean_out"),
            (f"{t}*", "invstd_out"),
            ("long", "batch"),
            ("long", "channels"),
            ("long", "inner"),
        ],
        nest([("c", "channels")], body),
    )
    w.call(
        out,
        [
            f"{x}.data_ptr()",
            *pointers,
            *(f"{o}.data_ptr()" for o in [out, *stats]),
            f"*_split({x}.shape, 1, 2)",
        ],
    )


def group_norm(w: Writer, node: fx.Node, op: str) -> None:
    values = arguments(node)
    source, weight, bias, groups, eps = values[0], values[1], values[2], values[6], values[7]
    x, t = w.var(source), ctype(source)
    out = w.alloc(node, f"{x}.shape", 0)
    stats = [w.alloc(node, f"({x}.shape[0], {groups})", k) for k in (1, 2)]
    at = "(n * channels + g * per_group + c) * inner + p"
    loops = [("c", "per_group"), ("p", "inner")]
    body = [
        "const long per_group = channels / groups;",
        *nest(
            [("n", "batch"), ("g", "groups")],
            [
                *_moments(x, loops, at, "(per_group * inner)"),
                f"const double rstd = 1.0 / std::sqrt(var + {literal(eps, 'double')});",
                *nest(
                    loops,
                    [
                        f"out[{at}] = static_cast<{t}>(({x}[{at}] - mean) * rstd"
                        f"{_affine(weight, bias, 'g * per_group + c')});"
                    ],
                    0,
                ),
                "mean_out[n * groups + g] = mean;",
                "rstd_out[n * groups + g] = rstd;",
            ],
            0,
        ),
    ]
    params, pointers = _weights(w, weight, bias)
    w.kernel(
        out,
        [
            (f"const {t}*", x),
            *params,
            (f"{t}*", "out"),
            (f"{t}*", "mean_out"),
            (f"{t}*", "rstd_out"),
            ("long", "batch"),
            ("long", "channels"),
            ("long", "inner"),
            ("long", "groups"),
        ],
        ["    " + line for line in body],
    )
    w.call(
        out,
        [
            f"{x}.data_ptr()",
            *pointers,
            *(f"{o}.data_ptr()" for o in [out, *stats]),
            f"*_split({x}.shape, 1, 2)",
            str(groups),
        ],
    )


# -- matmuls ------------------------------------------------------------------------


def matmul(w: Writer, node: fx.Node, op: str) -> None:
    """mm, bmm and addmm (bias + a @ b, the `nn.Linear` form): a dot product per output."""
    values = arguments(node)
    bias, a, b = (values[0], values[1], values[2]) if op == "addmm" else (None, *values[:2])
    beta, alpha = (values[3], values[4]) if op == "addmm" else (1, 1)
    t = ctype(node)
    batched = op == "bmm"
    first = "(bt * M + i)" if batched else "i"
    a_at, b_at = f"{first} * K + k", f"({'bt * K + ' if batched else ''}k) * N + j"
    result = "acc" if alpha == 1 else f"{literal(alpha, t)} * acc"
    params = [(f"const {ctype(a)}*", "a"), (f"const {ctype(b)}*", "b")]
    pointers = [f"{w.var(a)}.data_ptr()", f"{w.var(b)}.data_ptr()"]
    if isinstance(bias, fx.Node):
        index = broadcast_index(
            list(val(bias).shape), list(val(node).shape), ["i", "j"], ["M", "N"]
        )
        scale = "" if beta == 1 else f"{literal(beta, t)} * "
        result = f"{scale}bias[{index}] + {result}"
        params.append((f"const {ctype(bias)}*", "bias"))
        pointers.append(f"{w.var(bias)}.data_ptr()")
    an, bn = w.var(a), w.var(b)
    shape = (
        f"({an}.shape[0], {an}.shape[1], {bn}.shape[2])"
        if batched
        else (f"({an}.shape[0], {bn}.shape[1])")
    )
    out = w.alloc(node, shape)
    body = [
        f"{t} acc = 0;",
        *nest([("k", "K")], [f"acc += a[{a_at}] * b[{b_at}];"], 0),
        f"out[{first} * N + j] = {result};",
    ]
    loops = [*([("bt", "batch")] if batched else []), ("i", "M"), ("j", "N")]
    sizes = [("long", s) for s in (["batch"] if batched else []) + ["M", "K", "N"]]
    w.kernel(out, [*params, (f"{t}*", "out"), *sizes], nest(loops, body))
    w.call(out, [*pointers, f"{out}.data_ptr()", f"*{an}.shape", f"{bn}.shape[-1]"])


# -- pooling and convolution --------------------------------------------------------


def _per_dim(value: Any, count: int, default: int) -> list[int]:
    items = [value] if isinstance(value, int) else list(value or [])
    if not items:
        return [default] * count
    return items * count if len(items) == 1 else items


def _window(
    spatial: list[str], stride: list[int], padding: list[int], dilation: list[int]
) -> list[str]:
    """Each input position a window point reads, and a `continue` outside the input."""
    lines = [
        f"const long i{s} = o{s} * {st} - {pd} + k{s} * {dl};"
        for s, st, pd, dl in zip(spatial, stride, padding, dilation, strict=True)
    ]
    outside = " || ".join(f"i{s} < 0 || i{s} >= in_{s}" for s in spatial)
    return [*lines, f"if ({outside}) continue;"]


def pool(w: Writer, node: fx.Node, op: str) -> None:
    """Max or average pooling over the last 2 or 3 dims, one plane (n, c) at a time."""
    values = arguments(node)
    rank = 3 if "3d" in op else 2
    spatial = SPATIAL[rank]
    source, kernel = values[0], _per_dim(values[1], rank, 1)
    stride = _per_dim(values[2], rank, 0) if values[2] else kernel
    padding = _per_dim(values[3], rank, 0)
    is_max = op.startswith("max")
    dilation = _per_dim(values[4], rank, 1) if is_max else [1] * rank
    ceil_mode = values[5] if is_max else values[4]
    x, t = w.var(source), ctype(source)
    shape = (
        f"(*{x}.shape[:-{rank}], *_pooled({x}.shape[-{rank}:], {kernel}, {stride}, "
        f"{padding}, {dilation}, {ceil_mode}))"
    )
    outs = [w.alloc(node, shape, k) for k in range(2)] if is_max else [w.alloc(node, shape)]
    plane_in = horner(["c", *(f"i{s}" for s in spatial)], ["", *(f"in_{s}" for s in spatial)])
    plane_out = horner(["c", *(f"o{s}" for s in spatial)], ["", *(f"out_{s}" for s in spatial)])
    window = [(f"k{s}", str(k)) for s, k in zip(spatial, kernel, strict=True)]
    where = horner([f"i{s}" for s in spatial], [f"in_{s}" for s in spatial])
    if is_max:
        inner = [
            *_window(spatial, stride, padding, dilation),
            f"const {t} v = {x}[{plane_in}];",
            "if (v > best || v != v) {",
            "    best = v;",
            f"    best_at = {where};",
            "}",
        ]
        body = [
            f"{t} best = -INFINITY;",
            "long best_at = 0;",
            *nest(window, inner, 0),
            f"out[{plane_out}] = best;",
            f"indices[{plane_out}] = best_at;",
        ]
    else:
        body = _average(values, spatial, kernel, stride, padding, x, plane_in, t, plane_out)
    loops = [("c", "planes"), *((f"o{s}", f"out_{s}") for s in spatial)]
    sizes = [
        ("long", n)
        for n in ["planes", *(f"in_{s}" for s in spatial), *(f"out_{s}" for s in spatial)]
    ]
    outputs = [(f"{t}*", "out"), *([("int64_t*", "indices")] if is_max else [])]
    w.kernel(outs[0], [(f"const {t}*", x), *outputs, *sizes], nest(loops, body))
    w.call(
        outs[0],
        [
            f"{x}.data_ptr()",
            *(f"{o}.data_ptr()" for o in outs),
            f"_product({x}.shape[:-{rank}])",
            f"*{x}.shape[-{rank}:]",
            f"*{outs[0]}.shape[-{rank}:]",
        ],
    )


def _average(
    values: list[Any],
    spatial: list[str],
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    x: str,
    plane_in: str,
    t: str,
    plane_out: str,
) -> list[str]:
    count_include_pad, divisor_override = values[5], values[6]
    window = [(f"k{s}", str(k)) for s, k in zip(spatial, kernel, strict=True)]
    inner = [
        *_window(spatial, stride, padding, [1] * len(spatial)),
        f"acc += {x}[{plane_in}];",
        "count += 1;",
    ]
    if divisor_override:
        divisor = str(divisor_override)
    elif count_include_pad:  # the window clipped to the padded input
        divisor = " * ".join(
            f"(std::min(o{s} * {st} - {pd} + {k}, in_{s} + {pd}) - (o{s} * {st} - {pd}))"
            for s, st, pd, k in zip(spatial, stride, padding, kernel, strict=True)
        )
    else:
        divisor = "count"
    return [
        "double acc = 0.0;",
        "long count = 0;",
        *nest(window, inner, 0),
        f"out[{plane_out}] = static_cast<{t}>(acc / ({divisor}));",
    ]


def convolution(w: Writer, node: fx.Node, op: str) -> None:
    """A direct convolution (1 to 3 spatial dims, groups, transposed): a sum per output."""
    source, weight, bias, stride, padding, dilation, transposed, out_pad, groups = arguments(node)
    rank = len(val(source).shape) - 2
    if rank not in SPATIAL:
        raise CannotTranslate("aten.convolution", f"{rank} spatial dims")
    spatial = SPATIAL[rank]
    stride, padding = _per_dim(stride, rank, 1), _per_dim(padding, rank, 0)
    dilation, out_pad = _per_dim(dilation, rank, 1), _per_dim(out_pad, rank, 0)
    x, wt, t = w.var(source), w.var(weight), ctype(node)
    out = w.alloc(
        node,
        f"_convolved({x}.shape, {wt}.shape, {stride}, {padding}, {dilation}, "
        f"{transposed}, {out_pad}, {groups})",
    )
    channel = "g * group_in + ic"
    x_at = horner(
        ["n", channel, *(f"i{s}" for s in spatial)], ["", "in_c", *(f"in_{s}" for s in spatial)]
    )
    first = (
        "(g * group_in + ic) * group_out + oc % group_out" if transposed else ("oc * group_in + ic")
    )
    w_at = horner([first, *(f"k{s}" for s in spatial)], ["", *(f"k_{s}" for s in spatial)])
    reach = (
        _transposed_window(spatial, stride, padding, dilation)
        if transposed
        else (_window(spatial, stride, padding, dilation))
    )
    window = [("ic", "group_in"), *((f"k{s}", f"k_{s}") for s in spatial)]
    out_at = horner(
        ["n", "oc", *(f"o{s}" for s in spatial)], ["", "out_c", *(f"out_{s}" for s in spatial)]
    )
    body = [
        "const long g = oc / group_out;",
        f"{t} acc = {'bias[oc]' if isinstance(bias, fx.Node) else '0'};",
        *nest(window, [*reach, f"acc += {x}[{x_at}] * weight[{w_at}];"], 0),
        f"out[{out_at}] = acc;",
    ]
    params = [
        (f"const {t}*", x),
        (f"const {t}*", "weight"),
        *([(f"const {t}*", "bias")] if isinstance(bias, fx.Node) else []),
        (f"{t}*", "out"),
    ]
    names = [
        "batch",
        "in_c",
        *(f"in_{s}" for s in spatial),
        "out_c",
        *(f"out_{s}" for s in spatial),
        *(f"k_{s}" for s in spatial),
        "groups",
    ]
    code = [
        "    const long group_in = in_c / groups;",
        "    const long group_out = out_c / groups;",
        *nest([("n", "batch"), ("oc", "out_c"), *((f"o{s}", f"out_{s}") for s in spatial)], body),
    ]
    w.kernel(out, [*params, *(("long", n) for n in names)], code)
    pointers = [
        f"{x}.data_ptr()",
        f"{wt}.data_ptr()",
        *([f"{w.var(bias)}.data_ptr()"] if isinstance(bias, fx.Node) else []),
        f"{out}.data_ptr()",
    ]
    # a convolution's groups follow from its weight; a transposed one's are traced
    count = str(groups) if transposed else f"{x}.shape[1] // {wt}.shape[1]"
    w.call(out, [*pointers, f"*{x}.shape", f"*{out}.shape[1:]", f"*{wt}.shape[2:]", count])


def _transposed_window(
    spatial: list[str], stride: list[int], padding: list[int], dilation: list[int]
) -> list[str]:
    """The input position a transposed convolution's window point comes from, if any."""
    lines = []
    for s, st, pd, dl in zip(spatial, stride, padding, dilation, strict=True):
        lines += [
            f"const long t{s} = o{s} + {pd} - k{s} * {dl};",
            f"if (t{s} < 0 || t{s} % {st} != 0) continue;",
            f"const long i{s} = t{s} / {st};",
            f"if (i{s} >= in_{s}) continue;",
        ]
    return lines
