"""Values a reference writes as literals, read with `ast` (no import, no torch): what
`--scale` (task.py) and the judge's second shape (evaluate/wider.py) both rewrite."""

from __future__ import annotations

import ast


def int_literal(node: ast.expr) -> int | None:
    """The value of an integer expression of literals (`2048 * 2`), else None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = int_literal(node.left), int_literal(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        return left - right if isinstance(node.op, ast.Sub) else left * right
    return None
