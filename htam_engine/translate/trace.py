"""Trace a KernelBench reference to aten ops: the graph the C++ writer reads.

The reference is built and run on the meta device (no memory for KernelBench's
multi-GB inputs) and traced with `make_fx` under torch's core decompositions, so each
module call (`nn.Linear`, `F.gelu`, `x.softmax(dim)`) arrives as one of a small set of
aten ops with its shapes and dtypes in `node.meta["val"]`. Parameters and buffers come
first among the placeholders, then the forward's inputs, each named as the reference
names it.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._decomp import core_aten_decompositions
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx


@dataclass(frozen=True)
class Traced:
    """A reference's forward as aten ops: `weights` maps each placeholder that is a
    parameter or buffer to its qualified name, `inputs` each forward input to its name."""

    graph: fx.Graph
    weights: dict[str, str]
    inputs: dict[str, str]


def load_module(source: str, path: str) -> types.ModuleType:
    module = types.ModuleType("htam_reference_for_translation")
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)  # the user's own reference
    return module


def trace(source: str, path: str) -> Traced:
    """The reference's forward at its own shapes, as aten ops."""
    module = load_module(source, path)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = list(module.get_inputs())
    weights = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(weights)

    def forward(*flat: Any) -> Any:
        state = dict(zip(names, flat[: len(names)], strict=True))
        return functional_call(model, state, tuple(flat[len(names) :]))

    gm = make_fx(
        forward, decomposition_table=dict(core_aten_decompositions()), tracing_mode="fake"
    )(*weights.values(), *inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    arguments = _argument_names(model, len(inputs))
    return Traced(
        gm.graph,
        {p.name: name for p, name in zip(placeholders, names, strict=False)},
        {p.name: name for p, name in zip(placeholders[len(names) :], arguments, strict=True)},
    )


def _argument_names(model: torch.nn.Module, count: int) -> list[str]:
    """The forward's parameter names (`x`, `targets`), or `input{k}` past them."""
    try:
        found = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        found = []
    return [found[k] if k < len(found) else f"input{k}" for k in range(count)]
