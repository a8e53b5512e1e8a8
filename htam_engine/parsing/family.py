"""Operator family (matmul, reduction, elementwise, fused) of a task from the torch ops in
its Model's forward."""

from __future__ import annotations

from collections.abc import Iterator

from tree_sitter import Node

from htam_engine.parsing.python_source import call_name
from htam_engine.parsing.trees import parse, text, walk
from htam_engine.parsing.units import MODEL_CLASSES

MATMUL_OPS = {"matmul", "mm", "bmm", "linear", "Linear", "addmm", "baddbmm", "einsum", "@"}
MATMUL_OPS |= {"Conv1d", "Conv2d", "Conv3d", "conv1d", "conv2d", "conv3d"}
REDUCTION_OPS = {
    "softmax", "log_softmax", "Softmax", "LogSoftmax", "sum", "mean", "amax", "amin",
    "argmax", "argmin", "max", "min", "norm", "layer_norm", "LayerNorm", "group_norm",
    "GroupNorm", "batch_norm", "BatchNorm1d", "BatchNorm2d", "logsumexp", "cumsum",
    "cumprod", "var", "std", "prod", "rms_norm", "RMSNorm", "normalize",
}  # fmt: skip
ELEMENTWISE_OPS = {
    "relu", "ReLU", "gelu", "GELU", "sigmoid", "Sigmoid", "tanh", "Tanh", "exp", "log",
    "sqrt", "rsqrt", "abs", "clamp", "clip", "add", "sub", "mul", "div", "pow", "silu",
    "SiLU", "elu", "ELU", "leaky_relu", "LeakyReLU", "hardtanh", "Hardtanh", "softplus",
    "Softplus", "mish", "Mish", "hardswish", "Hardswish", "selu", "SELU", "erf", "where",
    "maximum", "minimum", "neg", "reciprocal", "square", "+", "-", "*", "/", "**",
}  # fmt: skip


def _op_category(name: str) -> str | None:
    for category, ops in (
        ("matmul", MATMUL_OPS),
        ("reduction", REDUCTION_OPS),
        ("elementwise", ELEMENTWISE_OPS),
    ):
        if name in ops:
            return category
    return None


def _class(root: Node, names: tuple[str, ...]) -> Node | None:
    for name in names:
        for node in root.children:
            if node.type == "class_definition" and text(node.child_by_field_name("name")) == name:
                return node
    return None


def _method(cls: Node, name: str) -> Node | None:
    body = cls.child_by_field_name("body")
    for node in body.named_children if body is not None else []:
        if node.type == "function_definition" and text(node.child_by_field_name("name")) == name:
            return node
    return None


def _submodules(cls: Node) -> dict[str, str]:
    """`self.x = nn.Something(...)` in __init__: attribute -> class name."""
    init = _method(cls, "__init__")
    found: dict[str, str] = {}
    for node in walk(init) if init is not None else []:
        if node.type == "assignment":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and right is not None and right.type == "call":
                found[text(left)] = call_name(right)
    return found


def _own_nodes(fn: Node) -> Iterator[Node]:
    """The nodes of a function outside the functions and lambdas defined in it (a Triton
    launch's grid function computes launch sizes, not the operator)."""
    stack = list(reversed(fn.children))
    while stack:
        node = stack.pop()
        yield node
        if node.type not in ("function_definition", "lambda"):
            stack.extend(reversed(node.children))


def _forward_ops(cls: Node) -> list[str]:
    forward = _method(cls, "forward")
    if forward is None:
        return []
    modules = _submodules(cls)
    ops = []
    for node in _own_nodes(forward):
        if node.type == "call":
            callee = text(node.child_by_field_name("function"))
            ops.append(modules.get(callee, callee.rsplit(".", 1)[-1]))
        elif node.type in ("binary_operator", "augmented_assignment"):
            operator = node.child_by_field_name("operator")
            ops.append(text(operator).rstrip("="))
    return ops


def family(source: str | bytes) -> str:
    """Operator family from the torch ops in `Model.forward` (else `ModelNew.forward`):
    `fused` is a matmul or convolution with other work around it; a reduction with
    elementwise work (a norm, a softmax written out) is a `reduction`: the strategies of
    a fused GEMM (tiling its operands, interchanging its loops) have nothing to do there."""
    root = parse(source, "python").root_node
    cls = _class(root, MODEL_CLASSES)
    if cls is None:
        return "unknown"
    categories = {c for c in map(_op_category, _forward_ops(cls)) if c is not None}
    if not categories:
        return "unknown"
    if len(categories) == 1:
        return categories.pop()
    return "fused" if "matmul" in categories else "reduction"
