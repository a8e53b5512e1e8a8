"""htam.results: a kernel's whole trajectory (every job), its offered suggestions, the plot
of all its steps and where their time went."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from htam_lsp import insight, render
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.history_plot import history_plot
from htam_lsp.offers import also_adds, first_changed_line, offered, suggestion_facts
from htam_lsp.rationale import notes
from htam_lsp.runs import job_name

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer


def results(ls: HtamServer, doc: Document, unit: Unit) -> dict[str, Any]:
    """htam.results: the kernel's whole trajectory, what is offered now (with the line
    each suggestion starts on, for a quickfix list) and the plot of every step."""
    graph = ls.graph(insight.backend(doc))
    history = ls.records.history(doc.uri)
    offer = offered(ls, doc)
    listed = [
        {
            "title": render.action_title(graph, s.record),
            "detail": render.suggestion_text(graph, s.record, also_adds(graph, doc, s)),
            "line": first_changed_line(doc, s),
            **suggestion_facts(s.record),
        }
        for s in offer.suggestions
    ]
    name = job_name(doc)
    plot = history_plot(doc.uri, name, history)
    parts = render.ResultsParts(name, history, [s["detail"] for s in listed], plot)
    markdown = render.results_markdown(graph, parts, notes(ls, graph, offer))
    return {"markdown": markdown, "kernel": name, "suggestions": listed, "plot": plot}
