"""The engine's view of an open kernel: backend, binding, state and the memory's preview.

Everything here is pure Python over the document and the memory (no torch). Results
that cost more than a lookup are cached on the document version; the policy and task
modules are imported on first use to keep the server's start-up short.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from htam_engine import parsing
from htam_engine.decisions import GlobalDecision
from htam_engine.state import State
from htam_engine.vocabulary import Backend
from htam_lsp import discovery
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document, uri_path

if TYPE_CHECKING:
    from htam_engine.episode import Episode
    from htam_engine.memory.model import Graph

REFERENCE_GLOB = "*ref*.py"
DIRECTIVE_BYTES = 4096  # the directive sits on one of the first lines
T = TypeVar("T")


def _cached(doc: Document, key: str, compute: Callable[[], T]) -> T:
    if key not in doc.cache:
        doc.cache[key] = compute()
    value: T = doc.cache[key]
    return value


def backend(doc: Document) -> Backend:
    """ "cuda", "triton" or "cpu": what the evaluation of this document would run on."""
    if doc.language == "cuda":
        return "cuda"
    if doc.language == "python":
        from htam_engine.task import guess_backend

        return _cached(doc, "backend", lambda: guess_backend("py", doc.text))
    return "cpu"


def binding(doc: Document) -> dict[str, str]:
    """The reference binding of a document: its directive, else its htam.toml entry."""
    return _cached(doc, "binding", lambda: _binding(doc))


def _binding(doc: Document) -> dict[str, str]:
    from htam_engine.task import parse_directive, toml_binding

    head = doc.source[:DIRECTIVE_BYTES].decode("utf-8", "replace")
    found = parse_directive(head)
    if found.get("reference"):
        return found
    path = uri_path(doc.uri)
    if path is None:
        return {}
    try:
        return toml_binding(Path(path))
    except Exception:  # a broken htam.toml must not break the editor; `htam` reports it
        return {}


def needs_binding(doc: Document) -> bool:
    """Whether a step needs the file bound to its reference first: an unbound `.cu`, or an
    unbound Python implementation that is not a KernelBench reference itself."""
    from htam_engine.task import is_reference

    if doc.language not in ("cuda", "python") or binding(doc).get("reference"):
        return False
    return doc.language == "cuda" or not _cached(doc, "reference", lambda: is_reference(doc.text))


def binding_target(doc: Document) -> Unit | None:
    """The unit the binding is said on when the cursor is in none: the first CUDA kernel,
    else the file's task (its `ModelNew`)."""
    first = next((u for u in discovery.units(doc) if u.kind == "global"), None)
    return first or discovery.task_unit(doc)


def guess_reference(doc: Document) -> str | None:
    """A sibling `*ref*.py` of the document (its name), if there is one."""
    path = uri_path(doc.uri)
    if path is None:
        return None
    siblings = sorted(Path(path).parent.glob(REFERENCE_GLOB))
    return siblings[0].name if siblings else None


def binding_directive(doc: Document, unit: Unit, all_units: list[Unit]) -> str:
    """The directive line that binds `unit`'s file to its reference (and, for a `.cu`, its
    host entry)."""
    reference = guess_reference(doc) or "REFERENCE.py"
    if doc.language == "python":
        return f"# htam: reference={reference}\n"
    hosts = [u.name for u in all_units if u.kind == "host"]
    if unit.kind == "host":
        entry = unit.name  # the host function under the cursor is the entry
    else:
        entry = unit.launchers[0] if unit.launchers else (hosts[0] if hosts else "HOST_FUNCTION")
    return f"// htam: reference={reference} entry={entry}\n"


def _family(doc: Document) -> str:
    if doc.language == "python":
        return parsing.family(doc.source)
    reference = binding(doc).get("reference")
    path = uri_path(doc.uri)
    if reference and path:
        ref = Path(path).parent / reference
        if ref.is_file():
            return parsing.family(ref.read_bytes())
    return "unknown"


def _features(doc: Document, unit: Unit, back: str) -> set[str]:
    """Tags of the unit's own code (a kernel function), or of the whole task file."""
    if unit.kind == "model":
        return _cached(doc, "features", lambda: parsing.features(doc.source, back))
    return parsing.features(doc.source[unit.start_byte : unit.end_byte], back)


def episode(doc: Document) -> Episode:
    """The run a step on this document would start, as the loop builds it."""
    from htam_engine.episode import Episode, task_signature

    back = backend(doc)
    family = _cached(doc, "family", lambda: _family(doc))
    return Episode(back, family, task_signature(back, family, _task_name(doc)))


def _task_name(doc: Document) -> str:
    """The loop's task name: from the bound reference, else from the document itself."""
    from htam_engine.task import task_name

    path = Path(uri_path(doc.uri) or doc.uri)
    reference = binding(doc).get("reference")
    return task_name(path.parent / reference if reference else path)


def state(doc: Document, unit: Unit) -> State:
    """s_t before any step: context and static features of this kernel, no feedback yet."""
    return episode(doc).state(_features(doc, unit, backend(doc)))


def preview(doc: Document, unit: Unit, graph: Graph) -> tuple[str, GlobalDecision]:
    """(state text, GlobalDecision JSON): what the memory would pick first for `unit`."""
    key = f"preview:{unit.name}:{graph.revision}"  # a step changes the memory: a new preview
    return _cached(doc, key, lambda: _preview(doc, unit, graph))


def _preview(doc: Document, unit: Unit, graph: Graph) -> tuple[str, GlobalDecision]:
    s = state(doc, unit)
    decision = episode(doc).choose_global(graph, s, random.Random(0))
    return s.describe(), decision
