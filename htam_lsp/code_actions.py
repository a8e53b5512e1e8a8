"""Code actions: bind to a reference, apply a measured suggestion (resolved against the
text as it is now), run the next step, and why strategies cannot run here."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

from lsprotocol import types as t
from pygls.capabilities import get_capability

from htam_engine import machine
from htam_lsp import discovery, insight, render
from htam_lsp import suggestions as sg
from htam_lsp.diagnostics import unbound_diagnostic
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.llm_provider import provider
from htam_lsp.offers import minimal_change, offered, position_json, suggestion_facts
from htam_lsp.positions import encode

if TYPE_CHECKING:
    from htam_lsp.server import HtamServer

ACTION_KIND = "refactor.rewrite.htam"


def code_actions(ls: HtamServer, doc: Document, offset: int) -> list[t.CodeAction]:
    unit = discovery.unit_at(doc, offset)
    found: list[t.CodeAction] = []
    if insight.needs_binding(doc):
        target = unit or insight.binding_target(doc)
        if target is not None:
            found.append(binding_action(ls, doc, target))
    if unit is None:
        return found
    found += suggestion_actions(ls, doc, unit)
    found += run_actions(ls, doc, unit)
    return found


def binding_action(ls: HtamServer, doc: Document, unit: Unit) -> t.CodeAction:
    title, edit = binding_edit(doc, unit)
    return t.CodeAction(
        title=title,
        kind=t.CodeActionKind.QuickFix,
        diagnostics=[unbound_diagnostic(ls, doc, unit)],
        is_preferred=True,
        edit=edit,
    )


def binding_edit(doc: Document, unit: Unit) -> tuple[str, t.WorkspaceEdit]:
    """What binds the file to its reference: its title and the directive as the first line
    (the quick fix, and `htam.bind` for the lens)."""
    directive = insight.binding_directive(doc, unit, discovery.units(doc))
    start = t.Position(0, 0)
    edit = t.TextEdit(range=t.Range(start, start), new_text=directive)
    return f"HTAM: bind to its reference ({directive.strip()})", t.WorkspaceEdit(
        changes={doc.uri: [edit]}
    )


def suggestion_actions(ls: HtamServer, doc: Document, unit: Unit) -> list[t.CodeAction]:
    """One action per strategy whose candidate clears the threshold; the fastest preferred.
    `data` carries the numbers, so that clients never read them out of the title."""
    graph = ls.graph(insight.backend(doc))
    resolves_edit = "edit" in (
        get_capability(
            ls.client_capabilities, "text_document.code_action.resolve_support.properties"
        )
        or []
    )
    tags = _tag_support(ls)
    found = []
    for rank, s in enumerate(offered(ls, doc).suggestions):
        record = s.record
        data = {"uri": doc.uri, "kernel": unit.name, **suggestion_facts(record)}
        node = graph.locals.get(record.step.local_id)
        action = t.CodeAction(
            title=render.action_title(graph, record),
            kind=f"{ACTION_KIND}.{record.step.local_id}",
            is_preferred=rank == 0 and not record.non_portable,
            data=data,
        )
        if tags and node is not None and not node.mechanical:
            action.tags = [t.CodeActionTag.LlmGenerated]
        if not resolves_edit:
            action.edit = suggestion_edit(ls, doc, data)
        found.append(action)
    return found


def _tag_support(ls: HtamServer) -> bool:
    values = (
        get_capability(ls.client_capabilities, "text_document.code_action.tag_support.value_set")
        or []
    )
    return t.CodeActionTag.LlmGenerated in values


def suggestion_edit(ls: HtamServer, doc: Document, data: dict[str, Any]) -> t.WorkspaceEdit:
    """The smallest single edit that applies suggestion `data["n"]` to the current text;
    ValueError when the kernel's text changed since it was measured."""
    kernel, number = str(data.get("kernel")), data.get("n")
    chosen = next((s for s in offered(ls, doc).suggestions if s.record.n == number), None)
    if chosen is None:
        raise ValueError(
            f"HTAM: suggestion #{number} for {kernel} no longer applies: the kernel's text "
            "changed since it was measured; run a step again"
        )
    text = doc.text
    base = len(encode(text[: chosen.start]))
    old, new = encode(text[chosen.start : chosen.end]), encode(chosen.new)
    start, old_end, replacement = minimal_change(old, new)
    edit = t.TextEdit(
        range=ls.lsp_range(doc, base + start, base + old_end),
        new_text=replacement.decode("utf-8", "surrogatepass"),
    )
    return _workspace_edit(ls, doc, edit, chosen.record)


def _workspace_edit(
    ls: HtamServer, doc: Document, edit: t.TextEdit, record: sg.StepRecord
) -> t.WorkspaceEdit:
    """The edit, labelled with its speedup where the client supports change annotations
    (VS Code's refactor preview, Ctrl+Enter in the light bulb, shows the diff and label).
    It does not need confirmation: accepting stays one step and one undo."""
    if not (
        get_capability(ls.client_capabilities, "workspace.workspace_edit.change_annotation_support")
        and get_capability(ls.client_capabilities, "workspace.workspace_edit.document_changes")
    ):
        return t.WorkspaceEdit(changes={doc.uri: [edit]})
    label = f"HTAM: {record.step.local_id} ({render.interval_text(record)} measured)"
    annotated = t.AnnotatedTextEdit(annotation_id="htam", range=edit.range, new_text=edit.new_text)
    identifier = t.OptionalVersionedTextDocumentIdentifier(doc.uri, doc.version)
    return t.WorkspaceEdit(
        document_changes=[t.TextDocumentEdit(identifier, [annotated])],
        change_annotations={
            "htam": t.ChangeAnnotation(label, description="a verified HTAM candidate")
        },
    )


def run_actions(ls: HtamServer, doc: Document, unit: Unit) -> list[t.CodeAction]:
    """Run the next step; or, where the client shows them, why strategies cannot run."""
    reasons = blocked_reasons(ls, doc)
    task = (discovery.task_unit(doc) or unit).name  # a job works on the whole file
    found = []
    argument = {
        "uri": doc.uri,
        "position": position_json(ls.lsp_range(doc, unit.name_start, unit.name_end).start),
    }
    if not reasons.get("all"):
        found.append(
            t.CodeAction(
                title=f"HTAM: run the next optimization step on {task}",
                kind=ACTION_KIND,
                command=t.Command("HTAM: next step", "htam.nextStep", arguments=[argument]),
            )
        )
    elif reasons.get("check"):
        found.append(
            t.CodeAction(
                title=f"HTAM: compile-check {task} with nvcc ({reasons['check']})",
                kind=f"{ACTION_KIND}.check",
                command=t.Command("HTAM: compile check", "htam.compileCheck", arguments=[argument]),
            )
        )
    if not get_capability(ls.client_capabilities, "text_document.code_action.disabled_support"):
        return found
    titles = {
        "all": f"HTAM: optimize {unit.name}",
        "llm": "HTAM: LLM-written strategies",
    }
    for key, reason in reasons.items():
        if key not in titles:
            continue
        found.append(
            t.CodeAction(
                title=titles[key],
                kind=ACTION_KIND,
                disabled=t.CodeActionDisabled(reason=reason),
            )
        )
    return found


def blocked_reasons(ls: HtamServer, doc: Document) -> dict[str, str]:
    """ "all": nothing can run (and why); "llm": only mechanical strategies can; "check":
    an nvcc compile check can run instead (and why)."""
    reasons: dict[str, str] = {}
    if not ls.settings.allow_execution:
        reasons["all"] = "execution is not allowed: trust this workspace or opt in (allowExecution)"
    elif insight.backend(doc) == "cuda" and not machine.gpu_present():
        reasons["all"] = "no GPU on this machine: CUDA candidates cannot be verified or timed"
        if shutil.which("nvcc") and not insight.needs_binding(doc):
            reasons["check"] = "no GPU here to run it"
    chosen, why = provider(ls)
    if chosen == "offline":
        reasons["llm"] = f"no LLM configured: mechanical strategies only ({why})"
    return reasons
