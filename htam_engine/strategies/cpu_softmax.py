"""A row softmax / log-softmax written as three passes (max, a sum of expf(x - max), the
normalising pass) becomes one call of a fused kernel with a vectorized exp.

The kernel reads the row once from memory, block by block (a block is re-read from L1):
each block's max, the running sum rescaled by exp(old - new max) when the max grows, the
block's exps. Softmax stores each block's exps and scales every block once by
exp(its max - the row's max) / sum at the end; log-softmax writes x - (max + log sum).
One exp per element, as the roofline counts them: the exp is an AVX2+FMA polynomial
(8 lanes, a Cephes-style degree-6 fit, within 2 ulp of expf over [-87, 88], clamped
there: exp(-inf - m) is about 1e-38, NaN stays NaN), or the same polynomial in scalar
code where the ISA lacks AVX2 (`#ifdef __AVX2__`). The block size is the rewrite's
parameter (autotuned).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from htam_engine import parsing
from htam_engine.parsing import cxx_source, text, walk
from htam_engine.strategies import analysis
from htam_engine.strategies.base import (
    LOW_OPT,
    Edit,
    Param,
    Plan,
    apply_edits,
    code_plan,
    flag_plan,
    tunable,
)
from htam_engine.strategies.cpu_fuse import _anchor, _best_reason, _only_reduction
from htam_engine.strategies.cpu_math import DEFINITIONS, plan_branchless, scalar_types

BLOCK = Param("block", 2048, (512, 2048, 8192))  # floats of a row per block (8 KiB default)
FLAGS = ["-O3", "-march=native"]  # -march=native defines __AVX2__ / __FMA__ where they are
SOFTMAX, LOG_SOFTMAX = "htam_softmax_row", "htam_log_softmax_row"

MARK = "// htam: fused row softmax / log-softmax with a vectorized exp"
KERNEL = r"""
// htam: fused row softmax / log-softmax with a vectorized exp
#include <math.h>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif
enum { HTAM_BLOCK = BLOCK_VALUE, HTAM_MARKS = 64 };
static inline float htam_exp1(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = floorf(x * 1.44269504f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return ldexpf(p, (int)n);
}
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 htam_exp8(__m256 x) {
    // max/min return their second operand where one is NaN: a NaN stays NaN
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline float htam_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float htam_hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
#endif
static float htam_block_max(const float* x, long n, float m) {
    long i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a = _mm256_set1_ps(m), b = a;
    for (; i + 16 <= n; i += 16) {
        a = _mm256_max_ps(a, _mm256_loadu_ps(x + i));
        b = _mm256_max_ps(b, _mm256_loadu_ps(x + i + 8));
    }
    m = htam_hmax8(_mm256_max_ps(a, b));
#endif
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}
// sum of exp(x - m) over a block, stored to y unless y is null
static float htam_block_exps(const float* x, float* y, long n, float m) {
    long i = 0;
    float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 mv = _mm256_set1_ps(m);
    __m256 a = _mm256_setzero_ps(), b = a;
    for (; i + 16 <= n; i += 16) {
        const __m256 e0 = htam_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        const __m256 e1 = htam_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
        if (y) {
            _mm256_storeu_ps(y + i, e0);
            _mm256_storeu_ps(y + i + 8, e1);
        }
        a = _mm256_add_ps(a, e0);
        b = _mm256_add_ps(b, e1);
    }
    s = htam_hsum8(_mm256_add_ps(a, b));
#endif
    for (; i < n; ++i) {
        const float e = htam_exp1(x[i] - m);
        if (y) y[i] = e;
        s += e;
    }
    return s;
}
static void htam_block_scale(float* y, long n, float f) {
    long i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 fv = _mm256_set1_ps(f);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), fv));
#endif
    for (; i < n; ++i) y[i] *= f;
}
static void htam_block_shift(const float* x, float* y, long n, float d) {
    long i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 dv = _mm256_set1_ps(d);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), dv));
#endif
    for (; i < n; ++i) y[i] = x[i] - d;
}
// one pass over the row in blocks: the running max m and sum s; marks[k]: block k's max
static float htam_online(const float* x, float* y, long n, float* marks, float* s) {
    float m = -INFINITY;
    *s = 0.0f;
    long b = 0, k = 0;
    for (; b < n; b += HTAM_BLOCK, ++k) {
        const long len = n - b < HTAM_BLOCK ? n - b : HTAM_BLOCK;
        const float grown = htam_block_max(x + b, len, m);
        if (grown > m) {
            *s *= htam_exp1(m - grown);
            m = grown;
        }
        *s += htam_block_exps(x + b, y ? y + b : y, len, m);
        if (marks) marks[k] = m;
    }
    return m;
}
static void htam_softmax_row(const float* x, float* y, long n) {
    float local[HTAM_MARKS];
    std::vector<float> heap;
    const long blocks = (n + HTAM_BLOCK - 1) / HTAM_BLOCK;
    float* marks = local;
    if (blocks > HTAM_MARKS) {
        heap.resize(blocks);
        marks = heap.data();
    }
    float s;
    const float m = htam_online(x, y, n, marks, &s);
    const float inv = 1.0f / s;
    long b = 0, k = 0;
    for (; b < n; b += HTAM_BLOCK, ++k) {
        const long len = n - b < HTAM_BLOCK ? n - b : HTAM_BLOCK;
        const float f = marks[k] == m ? inv : htam_exp1(marks[k] - m) * inv;
        htam_block_scale(y + b, len, f);
    }
}
static void htam_log_softmax_row(const float* x, float* y, long n) {
    float s;
    const float m = htam_online(x, nullptr, n, nullptr, &s);
    htam_block_shift(x, y, n, m + logf(s));
}
"""


def kernel(block: int) -> str:
    """The helpers' C++ with `block` floats per block."""
    return KERNEL.replace("BLOCK_VALUE", str(block))


@dataclass(frozen=True)
class Row:
    """The passes over one row: the max pass's loop, max and element, and the names."""

    loop: analysis.Loop
    m: str
    element: str  # the max pass's `X[...]`, spaces removed
    x: str  # the row's base pointer expression
    var: str


def _flat(value: str) -> str:
    """`value` without spaces, parentheses around a plain name or element or around the
    whole dropped."""
    flat = "".join(value.split())
    previous = None
    while previous != flat:
        previous = flat
        flat = re.sub(r"(?<![\w\]])\((\w+(\[[^\[\]()]*\])?)\)", r"\1", flat)
        if flat.startswith("(") and _closing(flat) == len(flat) - 1:
            flat = flat[1:-1]
    return flat


def _closing(flat: str) -> int:
    """The index of the parenthesis closing the one `flat` starts with."""
    depth = 0
    for index, char in enumerate(flat):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return index
    return -1


def _row_pointer(subscript: Node, var: str) -> str | None:
    """`X` for `X[var]`, `(X + (E))` for `X[E + var]` / `X[var + E]` (E free of var)."""
    array, index = (
        subscript.child_by_field_name("argument"),
        subscript.child_by_field_name("indices"),
    )
    index = analysis.strip_parens(index.named_children[0] if index is not None else None)
    if array is None or index is None:
        return None
    if index.type == "identifier" and text(index) == var:
        return text(array)
    if index.type != "binary_expression" or text(index.child_by_field_name("operator")) != "+":
        return None
    left, right = index.child_by_field_name("left"), index.child_by_field_name("right")
    for mine, other in ((left, right), (right, left)):
        known = mine is not None and other is not None and text(mine) == var
        if known and other is not None and not analysis.mentions(other, {var}):
            return f"({text(array)} + ({text(other)}))"
    return None


def _elements(node: Node) -> list[Node]:
    return [n for n in walk(node) if n.type == "subscript_expression"]


def _max_pass(node: Node, types: dict[str, str]) -> Row | str:
    found = _only_reduction(node, "max")
    if isinstance(found, str):
        return found
    loop, m = found
    reads = {_flat(text(e)) for e in _elements(node)}
    first = _elements(node)[0] if _elements(node) else None
    x = _row_pointer(first, loop.var) if first is not None else None
    if len(reads) != 1 or x is None:
        return "the max pass does not read one row element X[c]"
    if types.get(m) != "float":
        return f"the max {m!r} is not a float"
    if text(loop.start) not in ("0", "1"):
        return "the max pass does not start the row at 0 or 1"
    return Row(loop, m, reads.pop(), x, loop.var)


def _values(statements: list[Node]) -> dict[str, str]:
    """Local `name = value` declarations among `statements`, each value with the earlier
    ones substituted (parenthesized)."""
    values: dict[str, str] = {}
    for statement in statements:
        if statement.type != "declaration":
            continue
        for name, decl in analysis.declared_names(statement).items():
            value = decl.child_by_field_name("value")
            if value is not None:
                values[name] = f"({analysis.substitute(value, values)})"
    return values


def _assignments(body: Node, outer: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(target, operator, value) of the loop body's assignments, its locals (and `outer`)
    substituted."""
    statements = body.named_children if body.type == "compound_statement" else [body]
    values = {**(outer or {}), **_values(statements)}
    found = []
    for n in walk(body):
        if n.type == "assignment_expression":
            left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
            if left is not None and right is not None:
                op = text(n.child_by_field_name("operator"))
                found.append((_flat(text(left)), op, _flat(analysis.substitute(right, values))))
    return found


def _same_range(row: Row, node: Node) -> str | None:
    loop = analysis.canonical(node)
    if loop is None or not loop.unit_step or loop.var != row.var:
        return "the passes do not share one counted loop variable"
    if text(loop.start) != "0" or text(loop.bound) != text(row.loop.bound):
        return "the passes run over different ranges"
    return None


def _exp_pass(row: Row, node: Node) -> tuple[str, str | None] | str:
    """(the sum's name, the stored row element or None) of `s += expf(X[c] - m)`, with
    the exps stored to Y[c] or not; else why not."""
    reason = _same_range(row, node)
    if reason is not None:
        return reason
    body = node.child_by_field_name("body")
    assert body is not None
    exps = {f"{call}({row.element}-{row.m})" for call in ("expf", "exp", "std::exp")}
    stores = [(t, v) for t, op, v in _assignments(body) if op == "=" and "[" in t]
    sums = [(t, v) for t, op, v in _assignments(body) if op == "+=" and "[" not in t]
    if len(sums) != 1 or len(stores) > 1 or len(_assignments(body)) != len(stores) + 1:
        return "the exp pass is not one sum (and one store) of expf(x - max)"
    (s, added), stored = sums[0], stores[0] if stores else None
    if stored is not None and stored[1] in exps and added in (stored[0], stored[1]):
        return s, stored[0]
    return (s, None) if stored is None and added in exps else "the exp pass adds no expf(x - max)"


def _write_pass(row: Row, node: Node, between: list[Node], s: str, stored: str | None) -> str:
    """Which kernel the last pass makes of the row (`SOFTMAX` or `LOG_SOFTMAX`), or ""."""
    if _same_range(row, node) is not None:
        return ""
    body = node.child_by_field_name("body")
    assert body is not None
    found = _assignments(body, _values(between))
    if len(found) != 1:
        return ""
    target, op, value = found[0]
    if op in ("*=", "/="):
        op, value = "=", f"{target}{op[0]}{value}"
    if stored is not None and target == stored and op == "=":
        inverse = {f"{target}*{one}/{s}" for one in ("1.0f", "1.f", "1", "1.0")}
        forms = {
            f"{target}/{s}",
            *inverse,
            *(f"{target}*({v[len(target) + 1 :]})" for v in inverse),
        }
        return SOFTMAX if _flat(value) in forms else ""
    m, x = row.m, row.element
    logs = [f"{call}({s})" for call in ("logf", "log", "std::log")]
    lse = {f"{x}-({m}+{lg})" for lg in logs} | {f"{x}-({lg}+{m})" for lg in logs}
    lse |= {f"{x}-{m}-{lg}" for lg in logs} | {f"({x}-{m})-{lg}" for lg in logs}
    return LOG_SOFTMAX if stored is None and op == "=" and _flat(value) in lse else ""


Passes = tuple[Node, list[Node], Node, list[Node], Node, list[Node]]


def _triples(block: Node) -> list[Passes]:
    """(A, between, B, between, C, after) for three consecutive loops of a block."""
    statements = [s for s in block.named_children if s.type not in ("comment", "preproc_call")]
    loops = [i for i, s in enumerate(statements) if s.type == "for_statement"]
    return [
        (
            statements[a],
            statements[a + 1 : b],
            statements[b],
            statements[b + 1 : c],
            statements[c],
            statements[c + 1 :],
        )  # fmt: skip
        for a, b, c in zip(loops, loops[1:], loops[2:], strict=False)
    ]


def _fuse(code: bytes, triple: Passes, types: dict[str, str]) -> Edit | str:
    """The edit calling the fused kernel in place of the three passes, or why not."""
    first, between1, second, between2, third, after = triple
    row = _max_pass(first, types)
    if isinstance(row, str):
        return row
    exp = _exp_pass(row, second)
    if isinstance(exp, str):
        return exp
    s, stored = exp
    which = _write_pass(row, third, between2, s, stored)
    if not which:
        return (
            "the last pass neither divides the stored exps by the sum nor subtracts max + log(sum)"
        )
    if types.get(s) != "float":
        return f"the sum {s!r} is not a float"
    around = between1 + between2
    used = {name for b in around for name in analysis.declared_names(b)} | {row.m, s}
    if any(analysis.mentions(n, used) for n in after) or any(
        b.type != "declaration" for b in around
    ):
        return "the statements around the passes use what the passes compute"
    y = _row_pointer(_output(third), row.var)
    if y is None:
        return "the last pass does not write one row element Y[c]"
    call = f"{which}({row.x}, {y}, {text(row.loop.bound)});"
    return (_anchor(first).start_byte, third.end_byte, call)


def _output(node: Node) -> Node:
    body = node.child_by_field_name("body")
    assert body is not None
    targets = [t for t, _ in analysis.write_targets(body) if t.type == "subscript_expression"]
    return targets[0]


def plan_fused_code(code: bytes, root: Node) -> Plan:
    edits: list[Edit] = []
    reasons: list[str] = []
    for fn in cxx_source.functions(root):
        types = scalar_types(fn)
        for block in (n for n in walk(fn) if n.type == "compound_statement"):
            for triple in _triples(block):
                found = _fuse(code, triple, types)
                if isinstance(found, str):
                    reasons.append(found)
                else:
                    edits.append(found)
    return edits or _best_reason(reasons, "no three consecutive passes over a row")


def _helpers(block: int) -> Callable[[bytes, Node], Plan]:
    """The fused passes, and the kernel before the source's first definition."""

    def plan(code: bytes, root: Node) -> Plan:
        edits = plan_fused_code(code, root)
        if isinstance(edits, str) or MARK.encode() in code:
            return edits
        first = next((n for n in root.children if n.type in DEFINITIONS), None)
        at = first.start_byte if first is not None else len(code)
        return [(at, at, kernel(block).lstrip() + "\n"), *edits]

    return plan


def _fused(block: int) -> Callable[[bytes], Plan]:
    """The whole file's plan: the passes fused, the kernel, and -O3 -march=native."""

    def plan(data: bytes) -> Plan:
        selects = code_plan(data, "cpp", plan_branchless)  # `if (x > m) m = x;` is a max
        if isinstance(selects, list) and parsing.embedded_sources(data):
            selected = apply_edits(data, selects)
            fused = plan(selected)
            if isinstance(fused, list):
                return [(0, len(data), apply_edits(selected, fused).decode())]
        edits = code_plan(data, "cpp", _helpers(block))
        if isinstance(edits, str) or not parsing.embedded_sources(data):
            return edits
        flags = flag_plan(data, "extra_cflags", FLAGS, LOW_OPT)
        return edits + (flags if isinstance(flags, list) else [])

    return plan


REWRITES = [
    tunable(
        "cpu.fused_softmax",
        "cpu",
        "a row's max, sum-of-expf(x - max) and normalising passes (softmax or log-softmax) -> "
        "one call of a fused kernel: one pass over the row in blocks (autotuned: "
        f"{BLOCK.values} floats) with an AVX2+FMA polynomial exp (scalar without AVX2), one "
        "exp per element; -O3 -march=native",
        BLOCK,
        _fused,
        compound=True,
    )
]
