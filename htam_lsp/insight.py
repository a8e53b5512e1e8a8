"""The engine's view of an open kernel: backend, binding, state and the memory's preview.

Everything here is pure Python over the document and the memory (no torch); results
that cost more than a lookup are cached on the document version.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from htam_engine import parsing
from htam_engine.policy import PolicyConfig, make_prefix, select_global
from htam_engine.state import State
from htam_engine.task import _toml_binding, guess_backend, parse_directive
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document, uri_path

REFERENCE_GLOB = "*ref*.py"


def backend(doc: Document) -> str:
    """ "cuda" or "cpu": what the evaluation of this document would run on."""
    if doc.language == "cuda":
        return "cuda"
    if doc.language == "python":
        return guess_backend("py", doc.text)
    return "cpu"


def has_gpu() -> bool:
    """A cheap presence check: the NVIDIA driver's device node or tool (no torch here)."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def binding(doc: Document) -> dict[str, str]:
    """The reference binding of a `.cu` document: its directive, else its htam.toml entry."""
    found = parse_directive(doc.text)
    if found.get("reference"):
        return found
    path = uri_path(doc.uri)
    if path is None:
        return {}
    try:
        return _toml_binding(Path(path))
    except Exception:  # a broken htam.toml must not break the editor; `htam` reports it
        return {}


def needs_binding(doc: Document) -> bool:
    return doc.language == "cuda" and not binding(doc).get("reference")


def guess_reference(doc: Document) -> str | None:
    """A sibling `*ref*.py` of the document, relative to it, if exactly one is obvious."""
    path = uri_path(doc.uri)
    if path is None:
        return None
    siblings = sorted(Path(path).parent.glob(REFERENCE_GLOB))
    return siblings[0].name if siblings else None


def binding_directive(doc: Document, unit: Unit, all_units: list[Unit]) -> str:
    """The directive line that binds `unit`'s file to its reference and host entry."""
    reference = guess_reference(doc) or "REFERENCE.py"
    hosts = [u.name for u in all_units if u.kind == "host"]
    entry = unit.launchers[0] if unit.launchers else (hosts[0] if hosts else "HOST_FUNCTION")
    return f"// htam: reference={reference} entry={entry}\n"


def _family(doc: Document) -> str:
    if doc.language == "python":
        return parsing.family(doc.data)
    reference = binding(doc).get("reference")
    path = uri_path(doc.uri)
    if reference and path:
        ref = Path(path).parent / reference
        if ref.is_file():
            return parsing.family(ref.read_bytes())
    return "unknown"


def state(doc: Document, unit: Unit) -> State:
    """s_t before any step: context and static features of this kernel, no feedback yet."""
    back = backend(doc)
    family = _family(doc)
    source = doc.data if doc.language == "python" else doc.data[unit.start_byte : unit.end_byte]
    return State(
        backend=back,
        family=family,
        task_signature=f"{back}:{family}:{Path(uri_path(doc.uri) or doc.uri).stem}",
        features=parsing.features(source, back),
        feedback={"first_step"},
    )


def preview(doc: Document, unit: Unit, graph: Any) -> tuple[str, dict[str, Any]]:
    """(state text, GlobalDecision JSON): what the memory would pick first for `unit`."""
    key = f"preview:{unit.name}"
    if key not in doc.cache:
        config = PolicyConfig()
        s = state(doc, unit)
        decision = select_global(graph, make_prefix([], config.K), s, config, random.Random(0))
        doc.cache[key] = (s.describe(), decision.to_json())
    cached: tuple[str, dict[str, Any]] = doc.cache[key]
    return cached
