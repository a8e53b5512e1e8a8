"""Tree-sitter views of kernel code: parse trees, embedded sources, kernels, tags, family.

Pure and fast (no torch): the language server calls these on every edit. This package's
surface is the views the editor and the loop consume; the language-specific helpers the
rewrites use are in their modules:

- `trees`: parse, walk, text, has_errors
- `python_source`: loader calls, their arguments, embedded C++/CUDA sources and flags
- `cxx_source`: C++/CUDA functions, launches, loops, constants, per-function facts
- `triton_source`: `@triton.jit` functions, decorators, launches, `tl.*` calls, and
  `Kernel`, a Triton kernel with its launches (what the Triton rewrites and backend edit)
- `units`: `KernelUnit` and `kernels`, the kernel model the editor and the loop see
- `tags`: `features`, the static feature tags per backend
- `family`: the operator family of a task
"""

from htam_engine.parsing.family import family
from htam_engine.parsing.python_source import Embedded, embedded_sources
from htam_engine.parsing.tags import features
from htam_engine.parsing.trees import has_errors, parse, text, walk
from htam_engine.parsing.units import KernelUnit, kernels

__all__ = [
    "Embedded",
    "KernelUnit",
    "embedded_sources",
    "family",
    "features",
    "has_errors",
    "kernels",
    "parse",
    "text",
    "walk",
]
