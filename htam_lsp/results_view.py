"""htam.results: a kernel's trajectory, its offered suggestions and the last run's plot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from htam_lsp import insight, render
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.offers import also_adds, first_changed_line, offered, suggestion_facts
from htam_lsp.rationale import notes

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer


def results(ls: HtamServer, doc: Document, unit: Unit) -> dict[str, Any]:
    """htam.results: the kernel's whole trajectory, what is offered now (with the line
    each suggestion starts on, for a quickfix list) and the last run's speedup plot."""
    graph = ls.graph(insight.backend(doc))
    history = ls.records.history(doc.uri)
    offer = offered(ls, doc)
    listed = [
        {
            "title": render.action_title(graph, s.record, also_adds(graph, doc, s)),
            "line": first_changed_line(doc, s),
            **suggestion_facts(s.record),
        }
        for s in offer.suggestions
    ]
    plot = ls.runs.jobs.last_plot(doc.uri)
    parts = render.ResultsParts(unit.name, history, [s["title"] for s in listed], plot)
    markdown = render.results_markdown(graph, parts, notes(ls, graph, offer))
    return {"markdown": markdown, "kernel": unit.name, "suggestions": listed, "plot": plot}
