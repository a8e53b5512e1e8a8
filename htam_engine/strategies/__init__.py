"""Mechanical rewrites keyed by id (the `mechanical` field of local memory nodes).

`REGISTRY[id].check(source)` says why a rewrite does not apply (None when it does);
`REGISTRY[id].apply(source)` returns the rewritten file. Both take the whole candidate
file: a `.py` with embedded `load_inline` / `load_cpp` sources, a raw `.cu` / `.cpp`, or a
`.py` with `@triton.jit` kernels.
"""

from htam_engine.strategies.base import NotApplicable, Rewrite
from htam_engine.strategies.cpu import REWRITES as _CPU
from htam_engine.strategies.cpu_fuse import REWRITES as _CPU_FUSE
from htam_engine.strategies.cpu_math import REWRITES as _CPU_MATH
from htam_engine.strategies.cpu_matmul import REWRITES as _CPU_MATMUL
from htam_engine.strategies.cpu_softmax import REWRITES as _CPU_SOFTMAX
from htam_engine.strategies.cuda import REWRITES as _CUDA
from htam_engine.strategies.cuda_blocks import REWRITES as _CUDA_BLOCKS
from htam_engine.strategies.triton import REWRITES as _TRITON

REGISTRY: dict[str, Rewrite] = {
    rewrite.id: rewrite
    for rewrite in (
        *_CUDA,
        *_CUDA_BLOCKS,
        *_CPU,
        *_CPU_MATH,
        *_CPU_MATMUL,
        *_CPU_FUSE,
        *_CPU_SOFTMAX,
        *_TRITON,
    )
}

__all__ = ["REGISTRY", "NotApplicable", "Rewrite"]
