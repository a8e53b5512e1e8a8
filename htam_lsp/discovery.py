"""Kernel units of an open document, for symbols, lenses, hover and actions.

What a kernel is comes from `htam_engine.parsing.kernels`, the one kernel model the loop
uses too, run over the document's incrementally maintained trees (its function facts are
cached by text, so after an edit only the edited functions are looked at again). This
module adds the editor's facts on top: the unit under the cursor and static hints.
"""

from __future__ import annotations

from dataclasses import dataclass

from htam_engine import parsing
from htam_engine.parsing import KernelUnit as Unit
from htam_lsp.documents import Document

KERNEL_MARKERS = (b"@triton.jit", b"# htam: reference=")


@dataclass(frozen=True)
class Hint:
    """A static observation about one kernel, shown as a diagnostic."""

    start_byte: int
    end_byte: int
    message: str
    code: str


def units(doc: Document) -> list[Unit]:
    """The document's kernel units in document order (cached per document version)."""
    cached = doc.cache.get("units")
    if cached is None:
        cached = _discover(doc)
        doc.cache["units"] = cached
    return cached


def unit_at(doc: Document, offset: int) -> Unit | None:
    """The innermost kernel unit around a byte offset; else the document's model class,
    else its first kernel (commands sent without a position act on the whole task)."""
    around = kernel_around(doc, offset)
    return around if around is not None else task_unit(doc)


def task_unit(doc: Document) -> Unit | None:
    """The unit that names the document's task: its model class, else its first kernel. A
    job optimizes the whole file, so it is named by this wherever the cursor was."""
    kernels = [u for u in units(doc) if u.is_kernel]
    candidates = [u for u in kernels if u.kind == "model"] or kernels
    return candidates[0] if candidates else None


def kernel_around(doc: Document, offset: int) -> Unit | None:
    """The innermost kernel unit whose range holds the byte offset, if any."""
    around = [u for u in units(doc) if u.is_kernel and u.start_byte <= offset <= u.end_byte]
    return min(around, key=lambda u: u.end_byte - u.start_byte) if around else None


def _discover(doc: Document) -> list[Unit]:
    if doc.tree is None or doc.language is None:
        return []
    found = parsing.kernels(
        doc.source,
        doc.language,
        tree=doc.tree,
        embedded_tree=lambda e: doc.embedded_tree(e.start_byte, e.end_byte, e.language),
    )
    return found if doc.language != "python" or is_kernel_file(doc, found) else []


def is_kernel_file(doc: Document, found: list[Unit]) -> bool:
    """A Python file HTAM works on: one with an implementation (`ModelNew`, a load_inline /
    load_cpp source, a Triton kernel) or bound by a directive. A reference (`Model` alone)
    or any other `nn.Module` file gets nothing from HTAM: no lens, actions or hover."""
    if any(u.kind != "model" or u.name == "ModelNew" for u in found):
        return True
    return any(marker in doc.source for marker in KERNEL_MARKERS)


def hints(unit: Unit) -> list[Hint]:
    """Static hints on a CUDA kernel, placed on its name."""
    f = unit.facts
    if f is None or not f.is_global:
        return []
    found = []
    if f.unrestricted:
        found.append(
            Hint(
                unit.name_start,
                unit.name_end,
                f"{f.name}: pointer parameters without __restrict__ "
                f"({', '.join(f.unrestricted)}); if they never alias, __restrict__ lets the "
                "compiler cache loads (HTAM strategy cuda.restrict_const)",
                "no_restrict",
            )
        )
    if not f.bounds_checked:
        found.append(
            Hint(
                unit.name_start,
                unit.name_end,
                f"{f.name}: indexes with threadIdx/blockIdx but has no bounds check "
                "(e.g. `if (i < n)`); the last block may read or write out of range",
                "no_bounds_check",
            )
        )
    return found
