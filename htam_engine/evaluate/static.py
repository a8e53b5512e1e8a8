"""Static anti-cheat checks, run in the caller before a candidate is ever executed.

`kernelguard` (PyPI) supplies its rule set for GPU-kernel reward hacks; the checks
below add the hacks KernelBench's static checker lists that kernelguard does not flag
in this form (torch compute in `forward`, try/except bypass, monkey-patching, frame
inspection, side threads and streams, tensor subclasses, silent downcasts).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from htam_engine.evaluate.verdict import Check

# Ops that only allocate, view, reshape or copy data, by their names in both torch's
# Python API and aten (the static and the runtime check share them): anything else in a
# candidate's forward is torch doing the computation.
LAYOUT_OPS = frozenset(
    [
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "view",
        "reshape",
        "contiguous",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "t",
        "expand",
        "to",
        "clone",
        "detach",
        "copy_",
        "fill_",
        "zero_",
        "new_empty",
        "new_zeros",
        "new_full",
    ]
)
# Python-API names that are no computation either.
ALLOWED_TORCH = LAYOUT_OPS | {
    "tensor",
    "as_tensor",
    "from_numpy",
    "device",
    "dtype",
    "Size",
    "manual_seed",
    "no_grad",
    "inference_mode",
    "flatten",
    "size",
    "stride",
    "numel",
    "dim",
    "data_ptr",
    "is_contiguous",
    "cpu",
    "cuda",
    "float",
    "double",
    "item",
    "tolist",
    "get_device",
    "current_stream",
    "current_device",
    "synchronize",
    "is_available",
}
_TORCH_ROOTS = frozenset({"torch", "F", "nn", "functional"})
_PATCHED_ROOTS = frozenset({"time", "torch", "builtins", "sys", "gc", "inspect", "numpy", "np"})
_FRAME = re.compile(r"\b(_getframe|currentframe|f_back|f_locals|f_globals|get_referrers)\b")
_FRAME_CALLS = re.compile(r"\binspect\.(stack|getouterframes|trace)\b|\bgc\.get_objects\b")
_ASYNC = re.compile(
    r"\b(threading|concurrent\.futures|multiprocessing|asyncio)\b|torch\.cuda\.Stream\b"
    r"|\bstd::(thread|async|jthread)\b|\bpthread_create\b|\bcudaStreamCreate\w*\b"
)
_LOW_PRECISION = re.compile(
    r"\b(float16|bfloat16|half|__half2?|__nv_bfloat16|_Float16|__bf16)\b|\.half\(\)"
)


def _attr_chain(node: ast.AST) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def _forward_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node inside `ModelNew`'s methods."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            yield from ast.walk(node)


def _compute_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node in `ModelNew`'s methods but `__init__`, where building parameters with
    torch modules (as the reference does, for identical weights) is no computation."""
    for node in _forward_nodes(tree):
        if isinstance(node, ast.FunctionDef) and node.name != "__init__":
            yield from ast.walk(node)


def _torch_compute(tree: ast.Module) -> str:
    calls = []
    for node in _compute_nodes(tree):
        if isinstance(node, ast.Call):
            chain = _attr_chain(node.func)
            if len(chain) >= 2 and chain[0] in _TORCH_ROOTS and chain[-1] not in ALLOWED_TORCH:
                calls.append(f"line {node.lineno}: {'.'.join(chain)}")
    return "; ".join(calls)


def _reference_fallback(tree: ast.Module) -> str:
    hits = [
        f"line {node.lineno}: uses the reference `Model`"
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == "Model"
    ]
    return "; ".join(hits)


def _try_except(tree: ast.Module) -> str:
    lines = [str(n.lineno) for n in _forward_nodes(tree) if isinstance(n, ast.Try)]
    return f"try/except in ModelNew at line {', '.join(lines)}" if lines else ""


def _patched_targets(node: ast.AST) -> list[list[str]]:
    """Attribute chains that `node` assigns: `a.b = ...` or `setattr(a, ...)`."""
    if isinstance(node, ast.Assign):
        return [chain for t in node.targets if len(chain := _attr_chain(t)) > 1]
    if isinstance(node, ast.Call) and _attr_chain(node.func) == ["setattr"] and node.args:
        return [_attr_chain(node.args[0])]
    return []


def _monkeypatch(tree: ast.Module) -> str:
    hits = [
        f"line {getattr(node, 'lineno', '?')}: patches {'.'.join(chain)}"
        for node in ast.walk(tree)
        for chain in _patched_targets(node)
        if chain and chain[0] in _PATCHED_ROOTS
    ]
    return "; ".join(hits)


def _tensor_subclass(tree: ast.Module) -> str:
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [".".join(_attr_chain(base)) for base in node.bases]
            if any(base.endswith("Tensor") for base in bases):
                hits.append(f"line {node.lineno}: class {node.name} subclasses Tensor")
        if isinstance(node, ast.FunctionDef) and node.name in (
            "__torch_function__",
            "__torch_dispatch__",
        ):
            hits.append(f"line {node.lineno}: defines {node.name}")
    return "; ".join(hits)


def _regex_lines(pattern: re.Pattern[str], source: str) -> str:
    hits = [
        f"line {number}: {match.group(0)}"
        for number, line in enumerate(source.splitlines(), 1)
        for match in [pattern.search(line)]
        if match and not line.lstrip().startswith(("#", "//"))
    ]
    return "; ".join(hits)


def _kernelguard(source: str) -> str:
    import kernelguard

    result = kernelguard.analyze_code(source, compute_structural_hash=False)
    if not result["should_filter"]:
        return ""
    names = sorted({hit.get("pattern", "?") for hit in result["matched_patterns"]})
    return f"{result['filter_reason']} ({', '.join(names)})"


def static_checks(source: str, kind: str, reference_source: str) -> list[Check]:
    """Every static check on a candidate: a failed check names what it found."""
    text_checks: dict[str, Callable[[], str]] = {
        "static.kernelguard": lambda: _kernelguard(source),
        "static.frame_inspection": lambda: (
            _regex_lines(_FRAME, source) or _regex_lines(_FRAME_CALLS, source)
        ),
        "static.threads_streams": lambda: _regex_lines(_ASYNC, source),
    }
    if not _LOW_PRECISION.search(reference_source):
        text_checks["static.precision_downcast"] = lambda: _regex_lines(_LOW_PRECISION, source)
    checks = [Check(name, not (found := run()), found) for name, run in text_checks.items()]
    if kind != "py":
        return checks
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return checks  # reported as a compile error by the worker, with its line
    tree_checks: dict[str, Callable[[ast.Module], str]] = {
        "static.reference_fallback": _reference_fallback,
        "static.torch_compute": _torch_compute,
        "static.try_except": _try_except,
        "static.monkeypatch": _monkeypatch,
        "static.tensor_subclass": _tensor_subclass,
    }
    checks += [Check(name, not (found := run(tree)), found) for name, run in tree_checks.items()]
    return checks
