"""Code lenses: run, cancel or bind over each kernel, and the file's best offered suggestion."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as t

from htam_lsp import code_actions, discovery, insight, render
from htam_lsp.documents import Document
from htam_lsp.offers import offered, position_json

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer


def lenses(ls: HtamServer, doc: Document) -> list[t.CodeLens]:
    """Over each kernel: run / cancel, or bind the file to its reference where it is not
    (nothing could run); over the first, the file's best offered suggestion (a step
    optimizes the whole file, so there is one)."""
    found = []
    job = ls.runs.jobs.active(doc.uri)
    unbound = insight.needs_binding(doc)
    best_title = _best_title(ls, doc)
    for unit in discovery.units(doc):
        if not unit.is_kernel:
            continue
        where = ls.lsp_range(doc, unit.name_start, unit.name_end)
        argument = {"uri": doc.uri, "position": position_json(where.start)}
        if job is not None and job.unit == unit.name:
            title = f"HTAM: {job.message or job.state} (cancel)"
            command = t.Command(title, "htam.cancel", arguments=[{"jobId": job.id}])
        elif unbound:
            title, _ = code_actions.binding_edit(doc, unit)
            command = t.Command(title, "htam.bind", arguments=[argument])
        else:
            command = t.Command("Optimize with HTAM", "htam.nextStep", arguments=[argument])
        found.append(t.CodeLens(range=where, command=command))
        if best_title is not None:
            explain = t.Command(best_title, "htam.explain", arguments=[argument])
            found.append(t.CodeLens(where, explain))
            best_title = None
    return found


def _best_title(ls: HtamServer, doc: Document) -> str | None:
    offer = offered(ls, doc)
    best = offer.suggestions[0].record if offer.suggestions else None
    slower = render.best_slower(offer.slower)
    graph = ls.graph(insight.backend(doc))
    return render.best_lens_title(graph, best, slower, ls.settings.min_speedup)
