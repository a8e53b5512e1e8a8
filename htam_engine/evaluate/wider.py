"""Verification beyond the task's own input sets (design, "Correctness beyond the tested
inputs"), the judge's pure helpers for it; never timed.

An input set of the task's shape with its floating inputs scaled to reach |x| =
WIDE_MAGNITUDE (exp overflows fp32 past 88.7: a softmax without its max subtraction is
NaN there); the first input set run again (bit-identical outputs: no uninitialised
memory, no state kept between calls); and one input set at other sizes: each
module-level integer constant of at least MIN_SIZE made an odd number near OTHER_SHARE
of it (tails; cheaper than the task). A kernel wrong only there is correct at the
task's shape only (`protocol.SHAPE_ONLY`: a flag, not a failure).
"""

from __future__ import annotations

import ast
import secrets
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from htam_engine.evaluate import common
from htam_engine.literals import int_literal
from htam_engine.vocabulary import MIN_SIZE, OTHER_SHARE, WIDE_MAGNITUDE

WIDE = "verify.wide_values"
DETERMINISTIC = "verify.deterministic"
OTHER_SINGLES = 3  # sizes tried alone when changing them all at once fails
Outputs = list[torch.Tensor]
_rng = secrets.SystemRandom()


@dataclass(frozen=True)
class Extra:
    """An input set verified beyond the task's own (`WIDE`, `protocol.SHAPE_ONLY`):
    where it lies, its inputs, seed and expected outputs, and by how much its outputs'
    magnitude exceeds the task's (the absolute tolerance grows with it: summation
    order costs the same relative error at any scale)."""

    where: str
    inputs: list[Any]
    seed: int
    expected: Outputs
    scales: list[float]

    @property
    def out_items(self) -> list[dict[str, Any]]:
        return common.layout(self.expected)[0]


def widening(value: torch.Tensor) -> float:
    """The factor that makes `value` reach |x| = WIDE_MAGNITUDE on both sides of 0 where
    it has both signs (an overflow past +88 or past -88 is caught alike), its largest
    |x| at most twice that."""
    low, high = (float(v) for v in torch.aminmax(value))
    peak = max(-low, high)
    if low < 0 < high:
        return min(WIDE_MAGNITUDE / min(-low, high), 2 * WIDE_MAGNITUDE / peak)
    return WIDE_MAGNITUDE / peak


def magnitude(value: torch.Tensor) -> float:
    """The mean |value| (NaN or Inf where a value is not finite; 0 for integers)."""
    if not value.is_floating_point() or not value.numel():
        return 0.0
    return float(value.abs().mean())


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits (NaN included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    flat_a, flat_b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return bool(torch.equal(flat_a.view(torch.uint8), flat_b.view(torch.uint8)))


def equal_values(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if not identical(x, y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _constant(node: ast.stmt) -> tuple[str, ast.expr] | None:
    """`NAME = value` (or `NAME: int = value`) at module level: the name and value."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    return (target.id, value) if isinstance(target, ast.Name) else None


def size_constants(source: str) -> dict[str, int]:
    """The reference's module-level integer constants of at least `MIN_SIZE` (what
    `--scale` rewrites, and any other: `dim = 4096`), by name, as last assigned."""
    found: dict[str, int] = {}
    for node in ast.parse(source).body:
        named = _constant(node)
        value = int_literal(named[1]) if named else None
        if named:  # the last assignment counts
            found.pop(named[0], None)
            if value is not None and value >= MIN_SIZE:
                found[named[0]] = value
    return found


def other_size(value: int) -> int:
    """An odd size near `OTHER_SHARE` of `value`: smaller, with tails at any width."""
    size = int(value * OTHER_SHARE)
    return max(1, size - 1 if size % 2 == 0 else size)


def rewritten(source: str, path: Path, sizes: dict[str, int]) -> types.ModuleType:
    """The reference at `path` imported with its module-level constants `sizes` given
    new values (each assignment's value replaced, so sizes derived from them follow)."""
    tree = ast.parse(source)
    for node in tree.body:
        named = _constant(node)
        if named and named[0] in sizes and isinstance(node, ast.Assign | ast.AnnAssign):
            node.value = ast.copy_location(ast.Constant(sizes[named[0]]), named[1])
    name = f"htam_reference_other_{_rng.randrange(2**32)}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses and pickling look a module up by its name
    exec(compile(tree, str(path), "exec"), module.__dict__)
    return module


def describe_sizes(sizes: dict[str, int], task: dict[str, int]) -> str:
    new = ", ".join(f"{name}={value}" for name, value in sizes.items())
    return f"{new} (the task's: {', '.join(str(task[name]) for name in sizes)})"
