"""The torch ops that compute nothing, by their names in both torch's Python API and aten:
the static check (`static`) and the runtime one (`common`) share them.

Dependency-free: the judge and the workers import it (through `common`) beside torch,
and nothing here may add a parser's import to their start.
"""

from __future__ import annotations

# Ops that only allocate, view, reshape or copy data: anything else in a candidate's
# forward is torch doing the computation.
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
        "broadcast_to",
        "broadcast_tensors",
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
# Drawing random numbers is no computation either: a forward that draws them (an LSTM's
# initial state, a dropout mask) must draw them with torch to match the reference's.
RANDOM_OPS = frozenset(
    {"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm"}
    | {"normal_", "uniform_", "random_", "bernoulli", "bernoulli_"}
)
