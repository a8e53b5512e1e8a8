"""The hover (and htam.explain): the Markdown rationale of a kernel."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from htam_engine.formatting import format_speedup
from htam_lsp import insight, render
from htam_lsp import suggestions as sg
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.offers import also_adds, applied_text, offered
from htam_lsp.symbols import unit_detail

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph
    from htam_lsp.server import HtamServer


def explain(ls: HtamServer, doc: Document, unit: Unit) -> str:
    """The Markdown rationale of `unit` (hover and htam.explain)."""
    graph = ls.graph(insight.backend(doc))
    history = ls.records.history(doc.uri)
    offer = offered(ls, doc)
    diff, said = None, None
    if offer.suggestions:
        best = offer.suggestions[0]
        name = PurePosixPath(doc.uri).name
        diff = render.unified_diff(doc.text, applied_text(doc, best), name)
        said = render.suggestion_text(graph, best.record, also_adds(graph, doc, best))
    preview = None if history else insight.preview(doc, unit, graph)
    title = f"`{unit.name}` ({unit_detail(unit)})"
    parts = render.HoverParts(title, history, diff, preview, notes(ls, graph, offer), said)
    return render.hover_markdown(graph, parts)


def notes(ls: HtamServer, graph: Graph, offer: sg.Offer) -> list[str]:
    notes = [
        f"Applied: {render.move(graph, r.step)}: {render.gain_text(r)}" for r in offer.applied[-1:]
    ]
    # Alternatives to an applied candidate, measured against the same code, are superseded.
    superseded = {r.start for r in offer.applied}
    dropped = [r for r in offer.dropped if r.start not in superseded]
    if dropped:
        notes.append(
            f"{len(dropped)} measured candidate(s) no longer apply: the kernel's text "
            "changed since they were measured. Run a step again."
        )
    if offer.untimed and not offer.suggestions:
        note = offer.untimed[-1].step.verdict.note or "not timed here"
        notes.append(f"Correct candidates, but {note}: nothing to compare, nothing offered.")
    closest = render.best_slower(offer.slower)
    if closest is not None and not offer.suggestions:
        threshold = ls.settings.min_speedup
        notes.append(
            f"No candidate is offered: none was surely at least {format_speedup(threshold)} "
            f"faster than your code (setting minSpeedup); {render.below_text(closest, threshold)}."
        )
    return notes
