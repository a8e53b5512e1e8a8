"""The facts a performance engineer asks for first, as prompt text: the machine and the
timing's thread policy, the correctness rules, the task's shapes, dtypes and parameter
layouts and how parameters are synced, the times so far, and what earlier attempts did.

Also the feedback vocabulary every prompt and the state use (`step_line`): a speedup over
the best (timed in pairs, with the interval, kept or refused) and over PyTorch with its
interval, `inconclusive` with why where the machine's load made it noisy; never "slower"
for a candidate faster than the start but not than the best.
Reads the reference with `ast` (no import, no torch): a shape it cannot work out is
left out, never guessed.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence
from typing import Any

from htam_engine import kernels, machine, roofline
from htam_engine.evaluate.verdict import Limits, Verdict
from htam_engine.events import Step
from htam_engine.formatting import format_bounded, format_speedup
from htam_engine.llm.prompts import QUOTED, fence_block
from htam_engine.vocabulary import (
    MIN_SIZE,
    OTHER_SHARE,
    PRECISION_FACTOR,
    PRECISION_FLOORS,
    TOLERANCES,
    WIDE_MAGNITUDE,
    Status,
)

# atol = rtol per dtype, as `evaluate.common.tolerance` (a test keeps the two equal).
REFUSED = "not kept (not clearly faster than the best)"
MAX_ATTEMPTS = 6  # earlier steps shown in a prompt, newest first
ERROR_CHARS = 400

CHECKS = (
    "Correctness: {sets} fresh random input sets (seeds your code never sees) against the "
    "reference, atol = rtol by output dtype ({tolerances}; integers exact), plus a "
    "precision check against a float64 reference: relative L2 error at most {precision} "
    "or {factor:g}x the PyTorch reference's own error against it, whichever is more "
    "(float32 work done in half precision fails even inside the tolerance); inputs must "
    "stay unchanged; outputs must be fresh "
    "tensors of the reference's shapes and dtypes, without NaN/Inf; some timed calls' "
    "outputs are checked too. Beyond the task's inputs: one set scaled to reach |x| = "
    "{wide:g} with both signs (exp overflows float32 past 88.7), the first set again "
    "(bit-identical outputs), and one set at other sizes (each module-level integer "
    "constant of at least {min_size}, such as `batch_size = 256` but no tuple, made odd, "
    "near {share:.0%} of it; init arguments built from them follow): code right only at "
    "the task's sizes is marked `shape_only`.\n"
    "`cheating` (the worst outcome): calling the reference or torch to produce the output, "
    "cached or precomputed outputs, reading the judge's data, side threads or streams "
    "that hide work, tampering with timing. `not_custom_kernel`: a PyTorch/library op "
    "does the main work (allowed ops: {allowed}); in ModelNew, torch may only allocate, "
    "view, reshape, broadcast, copy or cast tensors (torch.empty, .view, .contiguous, "
    ".expand, .float), read sizes and pointers (.size(), .numel(), .data_ptr()) and draw "
    "random numbers; any other torch call there is refused."
)
SYNC = (
    "Parameters: `ModelNew(*get_init_inputs())` is built right after "
    "`torch.manual_seed(S)`, the seed `Model(*get_init_inputs())` gets, so they hold the "
    "same weights only if ModelNew creates the same parameters (the same nn modules with "
    "the same shapes, in the same order, e.g. keep `self.linear = nn.Linear(...)`); "
    "never re-initialize them. Work on the parameters alone (a "
    "transposed or packed weight) may be done once in __init__, after they are created, "
    "and kept across calls; everything that depends on the inputs is computed in every "
    "call."
)

# What a timed call holds around the kernel (both answerers asked, to weigh streaming
# stores and the output's allocation).
CALL = (
    "Each call's inputs are fresh, written just before it (inputs that fit may start in "
    "the last-level cache); its outputs are copied out right after, inside the timed call; "
    "a fresh output tensor reuses freed memory after warm-up (no page faults)."
)


def machine_text(backend: str, threads: int) -> str:
    facts = machine.cpu_facts()
    avx512 = any(f.startswith("avx512") for f in facts.isa)
    lines = [
        f"CPU: {facts.cpu}; {facts.cores} cores available; "
        f"caches: {', '.join(facts.caches) or 'unknown'}",
        f"ISA: {', '.join(facts.isa) or 'baseline x86-64'}"
        + ("" if avx512 else " (no AVX-512: do not use it)"),
        *([f"Core: {facts.core}"] if facts.core else []),
    ]
    for gpu in facts.gpus:
        lines.append(
            f"GPU: {gpu.get('name')}, SM {gpu.get('compute_cap')}, "
            f"{gpu.get('memory.total')} MiB, max clocks {gpu.get('clocks.max.sm')} MHz SM / "
            f"{gpu.get('clocks.max.memory')} MHz memory"
        )
    if backend == "cpu":
        lines.append(_build_text())
    if backend == "cpu" or not facts.gpus:
        lines.append(
            f"Timing: the reference and your kernel each run on {threads} thread(s) "
            "(OMP_NUM_THREADS is set so); OpenMP or other threads buy nothing here: "
            "speed comes from SIMD, caches and less work. " + CALL
            if threads == 1
            else f"Timing: both sides run on {threads} threads. " + CALL
        )
    return "\n".join(lines)


def _build_text() -> str:
    """How `load_cpp` builds (both answerers asked for its flags and caching)."""
    tools = kernels.toolchain()
    return (
        "Build: `load_cpp(name, source, extra_cflags)` runs the compiler with your "
        f"extra_cflags (default {list(kernels.DEFAULT_CFLAGS)}, which they replace), then "
        f"{' '.join(kernels.LIBRARY_FLAGS)}; it caches by source and flags (the name is for "
        "messages only) and returns a ctypes.CDLL" + (f"; {tools}" if tools else "") + "."
    )


# --- the task, read statically ----------------------------------------------------------

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_MAKERS = {"randn", "rand", "zeros", "ones", "empty", "randint", "full", "rand_like", "tensor"}


def _value(node: ast.AST, known: dict[str, Any]) -> Any:
    """A constant expression over known names, or raise KeyError/ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str):
        return node.value
    if isinstance(node, ast.Name):
        return known[node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_value(e, known) for e in node.elts)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left, known), _value(node.right, known))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand, known)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    raise ValueError("not a constant")


def _constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names bound to constants (`A = 2`, `A, B = 1, 2`, `A = B = 3`)."""
    known: dict[str, Any] = {}
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign):
            continue
        try:
            value = _value(stmt.value, known)
        except (KeyError, ValueError, TypeError, ZeroDivisionError):
            continue
        for target in stmt.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = value if isinstance(target, ast.Tuple) else (value,)
            if len(values) == len(names):
                pairs = zip(names, values, strict=True)
                known |= {n.id: v for n, v in pairs if isinstance(n, ast.Name)}
    return known


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == name), None)


def _returned(fn: ast.FunctionDef | None) -> list[ast.expr]:
    """The elements of the list `fn` returns, a local name replaced by its value."""
    local: dict[str, ast.expr] = {}
    for node in ast.walk(fn) if fn else []:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            local[node.targets[0].id] = node.value
        if isinstance(node, ast.Return) and isinstance(node.value, ast.List | ast.Tuple):
            elts = node.value.elts
            return [local.get(e.id, e) if isinstance(e, ast.Name) else e for e in elts]
    return []


def _tensor(call: ast.expr, known: dict[str, Any]) -> str | None:
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return None
    if call.func.attr not in _MAKERS:
        return None
    try:
        args = [_value(a, known) for a in call.args]
        kw = {k.arg: _value(k.value, known) for k in call.keywords if k.arg}
    except (KeyError, ValueError, TypeError):
        return None
    shape = args[-1] if call.func.attr == "randint" and args else args
    if call.func.attr == "full" and args:
        shape = args[0]
    dims = shape if isinstance(shape, tuple) else tuple(shape)
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], tuple) else dims
    dtype = str(kw.get("dtype", "torch.int64" if call.func.attr == "randint" else "torch.float32"))
    return f"{dtype.removeprefix('torch.')}[{', '.join(map(str, dims))}]"


def _layouts(tree: ast.Module, init: list[Any]) -> list[str]:
    """`self.name = nn.Linear(...)` and friends in Model.__init__, with weight shapes."""
    model = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Model"), None)
    ctor = next(
        (s for s in model.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None
    ) if model else None  # fmt: skip
    if ctor is None:
        return []
    params = [a.arg for a in ctor.args.args[1:]]
    known = _constants(tree) | dict(zip(params, init, strict=False))
    found = []
    for node in ast.walk(ctor):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        try:
            args = [_value(a, known) for a in node.value.args]
        except (KeyError, ValueError, TypeError):
            args = []
        name = ast.unparse(node.targets[0])
        biased = not any(
            k.arg == "bias" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in node.value.keywords
        )
        if kind == "Linear" and len(args) >= 2:
            bias = f"bias ({args[1]})" if biased else "no bias (bias=False)"
            found.append(
                f"{name} = nn.Linear({args[0]}, {args[1]}): weight ({args[1]}, {args[0]}) "
                f"= (out_features, in_features), row-major; {bias}; forward computes "
                f"x @ weight.T{' + bias' if biased else ''}"
            )
        elif kind.startswith("Conv") and len(args) >= 3:
            found.append(
                f"{name} = nn.{kind}{tuple(args)}: weight (out_channels, in_channels/groups, "
                "*kernel_size), bias (out_channels)"
            )
        elif kind:
            found.append(f"{name} = {ast.unparse(node.value)}")
    return found


def task_text(reference: str, shapes: Sequence[str] = ()) -> str:
    """Inputs (shapes, dtypes), init arguments and parameter layouts of a reference;
    `shapes`, the judge's own sizing of the inputs, where it has one (the reference read
    statically knows only the inputs written as one `torch.randn(...)` of constants)."""
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return ""
    known = _constants(tree)
    read = [_tensor(e, known) for e in _returned(_function(tree, "get_inputs"))]
    inputs: list[str | None] = list(shapes) or read
    init: list[Any] = []
    for e in _returned(_function(tree, "get_init_inputs")):
        try:
            init.append(_value(e, known))
        except (KeyError, ValueError, TypeError):
            init.append("?")
    lines = []
    if inputs:
        shown = [f"x{i}: {t or 'unknown'}" for i, t in enumerate(inputs)]
        lines.append(f"Inputs (contiguous, on the device): {'; '.join(shown)}")
    lines.append(f"Init arguments: {init}")
    lines += [f"Parameter: {line}" for line in _layouts(tree, init)]
    return "\n".join(lines)


# --- the feedback vocabulary ------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g} ms"


def _light(verdict: Verdict) -> str:
    """How far the implementation is from this machine's limit ("", not yet known)."""
    light = roofline.describe(verdict.roofline)
    return f", {light}" if light else ""


def _measured(verdict: Verdict) -> str:
    """A timing over PyTorch with its interval, and why it is not to be trusted where it
    is not: "1.46x (95 % 1.41-1.52) over PyTorch", "... over PyTorch, inconclusive (noisy:
    load 4.1 on 2 cores)"."""
    interval = verdict.interval
    bounds = (interval.low, interval.high) if interval else None
    text = f"{format_bounded(verdict.speedup, bounds)} over PyTorch"
    if verdict.suspect:
        return f"{text}, suspect (faster than this machine's limit: not to be believed)"
    if verdict.noisy:
        load = verdict.load or {}
        busy = max(load.get("before", 0.0), load.get("after", 0.0))
        why = f"load {busy:.1f} on {load.get('cores', '?')} cores" if load else "did not narrow"
        return f"{text}, inconclusive (noisy: {why})"
    return text


def times_text(
    start: Verdict | None, best: Verdict | None, best_step: int, shown: int | None = None
) -> str:
    """The reference's, the start's and the best's times, each with its interval and the
    reference's time in its own pairs (the best's 2.36 ms beside the start's PyTorch
    3.44 ms read as 1.46x where its pairs said 1.07x), and the harness's own share of
    every timed call in the newest timing; `shown`, the step whose code the prompt
    shows where that is not the best's (a tie the next step builds on)."""
    if start is None or start.ref_runtime_ms is None:
        return "Times: not measured yet."
    lines = [
        f"PyTorch reference: {_ms(start.ref_runtime_ms)}; starting implementation: "
        f"{_ms(start.runtime_ms)} ({_measured(start)})" + _light(start)
    ]
    if best is not None and best_step:
        where = "" if shown is not None else ", the code shown below"
        lines.append(
            f"Best kept (step {best_step}{where}): {_ms(best.runtime_ms)} against PyTorch's "
            f"{_ms(best.ref_runtime_ms)} in the same pairs ({_measured(best)})" + _light(best)
        )
    elif shown is None:
        lines.append("The code shown below is the starting implementation (nothing beat it yet).")
    if shown is not None:
        lines.append(
            f"The code shown below is step {shown}'s: not kept (not clearly faster than the "
            "best), but the memory expects the next change to pay off from it."
        )
    newest = best if best is not None and best_step else start
    if harness := newest.spread.get("harness_ms"):
        lines.append(
            f"Every timed call, on both sides, includes the harness's own work ({harness:.2g} "
            "ms in the newest timing: staging the inputs, copying the outputs out): a kernel "
            "faster than that gains less than its own time suggests. Times differ between "
            "timings as the machine's load does: compare within a line, not across lines."
        )
    return "\n".join(lines)


def step_line(step: Step) -> str:
    """One step in the feedback vocabulary, with why it failed or was refused: a result
    timed in pairs where there is one (an estimate from unpaired timings beside it could
    contradict it), and the timing over PyTorch with its interval."""
    head = f"step {step.step} {step.global_id}/{step.local_id}: {step.status}"
    verdict = step.verdict
    if step.status == Status.NO_CODE:
        return f"{head}: {step.note or 'no code'}"
    if not verdict.correct:
        why = failure_note(verdict)  # the candidate's own words: quoted, on one line
        return f"{head}: why ({QUOTED}): {fence_block(why, inline=True)}" if why else head
    parts = []
    duel = step.versus_best
    if duel is not None and duel.speedup is not None:
        bounds = f", 95 % {duel.low:.2f}-{duel.high:.2f}" if duel.bounds else ""
        kept = "kept as the new best" if duel.confirmed else REFUSED
        parts.append(f"{duel.speedup:.2f}x over the best in pairs{bounds}: {kept}")
    elif step.status == Status.IMPROVED:
        parts.append("kept as the new best")
    else:
        estimate = f" (est. {format_speedup(step.speedup)} over the start)" if step.speedup else ""
        parts.append(f"not kept (not faster than the best){estimate}")
    parts.append(_measured(verdict))
    return f"{head}: {'; '.join(parts)}"


def failure_note(verdict: Verdict) -> str:
    """What a failed or refused verdict says, for the memory's evidence ("" if correct at
    every size; a kernel right at the task's shape only says where it is wrong)."""
    if verdict.correct:
        flagged = [c.detail for c in verdict.checks if not c.passed and verdict.shape_only]
        return "; ".join(flagged)[:ERROR_CHARS]
    error = verdict.error
    failed = [f"{c.name}: {c.detail}" for c in verdict.checks if not c.passed][:2]
    head = f"{error.kind.value}: {error.message} {error.excerpt}".strip() if error else ""
    return "; ".join(filter(None, [head, *failed]))[:ERROR_CHARS]


def attempts_text(steps: Sequence[Step]) -> str:
    """Earlier steps of this run, newest first."""
    shown = [step_line(s) for s in reversed(steps[-MAX_ATTEMPTS:])]
    return "\n".join(f"- {line}" for line in shown) if shown else "none yet (first step)"


def _tolerances() -> str:
    return ", ".join(f"{dtype} {tol:g}" for dtype, tol in TOLERANCES.items())


def _precision_floors() -> str:
    return ", ".join(f"{floor:g} ({dtype})" for dtype, floor in PRECISION_FLOORS.items())


def facts_block(
    *,
    backend: str,
    threads: int,
    reference: str,
    allowed: Sequence[str] = (),
    start: Verdict | None = None,
    best: Verdict | None = None,
    best_step: int = 0,
    shapes: Sequence[str] = (),
    shown: int | None = None,
    code: Verdict | None = None,
) -> str:
    """Machine, timing, correctness, task and times: the generation prompt's facts;
    `code`, the verdict of the code the prompt shows (its vectorizer report: the best's
    or the start's where not given)."""
    checks = CHECKS.format(
        sets=Limits().input_sets,
        tolerances=_tolerances(),
        precision=_precision_floors(),
        factor=PRECISION_FACTOR,
        wide=WIDE_MAGNITUDE,
        min_size=MIN_SIZE,
        share=OTHER_SHARE,
        allowed=", ".join(allowed) or "none",
    )
    parts = [machine_text(backend, threads), checks, task_text(reference, shapes), SYNC]
    parts.append(times_text(start, best, best_step, shown))
    parts.append(vectorizer_text(code or (best if best is not None and best_step else start)))
    return "\n".join(p for p in parts if p)


def vectorizer_text(current: Verdict | None) -> str:
    """What GCC's vectorizer did with the current code's loops ("" where it did not say)."""
    if current is None or not current.vectorizer:
        return ""
    return (
        "GCC's vectorizer on the code shown below (-fopt-info-vec; lines of the C++ source "
        f"string, {QUOTED}):\n{fence_block(current.vectorizer)}"
    )
