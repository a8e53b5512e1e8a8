"""LSP results built from the documents, the records and the memory.

Kept apart from server.py (the wiring) so that each feature is a plain function of the
server state; `ls` is the `HtamServer` (typed loosely to avoid an import cycle).
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from lsprotocol import types as t

from htam_engine import machine, parsing
from htam_engine.report import format_speedup
from htam_lsp import discovery, insight, render
from htam_lsp import suggestions as sg
from htam_lsp.discovery import Unit
from htam_lsp.documents import Document
from htam_lsp.positions import encode
from htam_lsp.protocol import Prerendered

ACTION_KIND = "refactor.rewrite.htam"
SOURCE = "htam"
_SYMBOL_KINDS = {
    "global": t.SymbolKind.Function,
    "host": t.SymbolKind.Function,
    "model": t.SymbolKind.Class,
    "module": t.SymbolKind.Module,
}
_HINT_SEVERITY = {
    "no_restrict": t.DiagnosticSeverity.Hint,
    "no_bounds_check": t.DiagnosticSeverity.Information,
}


def _detail(unit: Unit) -> str:
    if unit.kind == "global":
        launched = f", launched by {', '.join(unit.launchers)}" if unit.launchers else ""
        return f"__global__ kernel{launched}"
    if unit.kind == "host":
        return "C++ kernel (CPU)" if unit.language == "cpp" else "host function"
    return {"model": "KernelBench model", "module": "inline extension"}.get(unit.kind, unit.kind)


# --- symbols ------------------------------------------------------------------------------


def symbols(ls: Any, doc: Document) -> Prerendered:
    """Kernel units as a hierarchy (units nested by range), built and serialized once per
    version: JSON-ready dicts, since pygls would otherwise convert ~400 objects per request."""
    encoding = ls.encoding
    key = f"symbols:{encoding}"
    if key not in doc.cache:
        doc.cache[key] = Prerendered(_symbol_tree(doc, encoding))
    cached: Prerendered = doc.cache[key]
    return cached


def _symbol_tree(doc: Document, encoding: str) -> list[dict[str, Any]]:
    roots: list[dict[str, Any]] = []
    stack: list[tuple[Unit, dict[str, Any]]] = []
    for unit in sorted(discovery.units(doc), key=lambda u: (u.start_byte, -u.end_byte)):
        symbol = {
            "name": unit.name or "<anonymous>",
            "detail": _detail(unit),
            "kind": int(_SYMBOL_KINDS.get(unit.kind, t.SymbolKind.Function)),
            "range": _range_json(doc, unit.start_byte, unit.end_byte, encoding),
            "selectionRange": _range_json(doc, unit.name_start, unit.name_end, encoding),
        }
        while stack and stack[-1][0].end_byte < unit.end_byte:
            stack.pop()
        if stack:
            stack[-1][1].setdefault("children", []).append(symbol)
        else:
            roots.append(symbol)
        stack.append((unit, symbol))
    return roots


def _range_json(doc: Document, start: int, end: int, encoding: str) -> dict[str, Any]:
    (sl, sc), (el, ec) = doc.index.position(start, encoding), doc.index.position(end, encoding)
    return {"start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}}


# --- code lens ----------------------------------------------------------------------------


def lenses(ls: Any, doc: Document) -> list[t.CodeLens]:
    """Over each kernel: run / cancel; over the first, the file's best offered suggestion
    (a step optimizes the whole file, so there is one)."""
    found = []
    job = ls.jobs.active(doc.uri)
    best_title = _best_title(ls, doc)
    for unit in discovery.units(doc):
        if not unit.is_kernel:
            continue
        where = ls.lsp_range(doc, unit.name_start, unit.name_end)
        argument = {"uri": doc.uri, "position": _position_json(where.start)}
        if job is not None and job.kernel == unit.name:
            title = f"HTAM: {job.message or job.state} (cancel)"
            command = t.Command(title, "htam.cancel", arguments=[{"jobId": job.id}])
        else:
            command = t.Command("Optimize with HTAM", "htam.nextStep", arguments=[argument])
        found.append(t.CodeLens(range=where, command=command))
        if best_title is not None:
            explain = t.Command(best_title, "htam.explain", arguments=[argument])
            found.append(t.CodeLens(where, explain))
            best_title = None
    return found


def _best_title(ls: Any, doc: Document) -> str | None:
    offer = offered(ls, doc)
    best = offer.suggestions[0].record if offer.suggestions else None
    slower = render.best_slower(offer.slower)
    graph = ls.graph(insight.backend(doc))
    return render.best_lens_title(graph, best, slower, ls.settings.min_speedup)


def _position_json(position: t.Position) -> dict[str, int]:
    return {"line": position.line, "character": position.character}


def offered(ls: Any, doc: Document) -> sg.Offer:
    """What the kernel's history offers the document's current text (cached per version,
    history and threshold: a step that ends without an edit changes the answer)."""
    history = ls.records.history(doc.uri)
    key = f"offer:{ls.records.revision}:{ls.settings.min_speedup}"
    if key not in doc.cache:
        text = doc.text if history else ""  # no history: no need to decode the file
        doc.cache[key] = sg.offer(history, text, ls.settings.min_speedup)
    cached: sg.Offer = doc.cache[key]
    return cached


# --- hover / explain ----------------------------------------------------------------------


def explain(ls: Any, doc: Document, unit: Unit) -> str:
    """The Markdown rationale of `unit` (hover and htam.explain)."""
    graph = ls.graph(insight.backend(doc))
    history = ls.records.history(doc.uri)
    offer = offered(ls, doc)
    diff = None
    if offer.suggestions:
        name = PurePosixPath(doc.uri).name
        diff = render.unified_diff(doc.text, applied_text(doc, offer.suggestions[0]), name)
    preview = None if history else insight.preview(doc, unit, graph)
    parts = render.HoverParts(
        f"`{unit.name}` ({_detail(unit)})", history, diff, preview, _notes(ls, graph, offer)
    )
    return render.hover_markdown(graph, parts)


def _notes(ls: Any, graph: Any, offer: sg.Offer) -> list[str]:
    notes = [
        f"Applied: {render.move(graph, r.step)}, measured {render.gain_text(r)}"
        for r in offer.applied[-1:]
    ]
    if offer.dropped:
        notes.append(
            f"{len(offer.dropped)} measured candidate(s) no longer apply: the kernel's text "
            "changed since they were measured. Run a step again."
        )
    if offer.untimed and not offer.suggestions:
        note = offer.untimed[-1].step.verdict.get("note") or "not timed here"
        notes.append(f"Correct candidates, but {note}: nothing to compare, nothing offered.")
    closest = render.best_slower(offer.slower)
    if closest is not None and not offer.suggestions:
        threshold = ls.settings.min_speedup
        notes.append(
            f"No candidate is offered: none was surely at least {format_speedup(threshold)} "
            f"faster than your code (setting minSpeedup); {render.below_text(closest, threshold)}."
        )
    return notes


def applied_text(doc: Document, suggestion: sg.Suggestion) -> str:
    text = doc.text
    return text[: suggestion.start] + suggestion.new + text[suggestion.end :]


# --- diagnostics --------------------------------------------------------------------------


def diagnostics(ls: Any, doc: Document) -> list[t.Diagnostic]:
    found = []
    units = discovery.units(doc)
    for unit in units:
        for hint in discovery.hints(unit):
            found.append(
                t.Diagnostic(
                    range=ls.lsp_range(doc, hint.start_byte, hint.end_byte),
                    message=hint.message,
                    severity=_HINT_SEVERITY.get(hint.code, t.DiagnosticSeverity.Hint),
                    source=SOURCE,
                    code=hint.code,
                )
            )
    first = next((u for u in units if u.kind == "global"), None)
    if first is not None and insight.needs_binding(doc):
        found.append(_unbound_diagnostic(ls, doc, first))
    error = ls.compile_errors.get(doc.uri)
    if error is not None:
        found.append(_compile_diagnostic(ls, doc, *error))
    return found


def _unbound_diagnostic(ls: Any, doc: Document, unit: Unit) -> t.Diagnostic:
    return t.Diagnostic(
        range=ls.lsp_range(doc, unit.name_start, unit.name_end),
        message=(
            "HTAM: this file is not bound to a PyTorch reference, so it cannot be verified "
            "or timed; add `// htam: reference=REF.py entry=HOST_FUNCTION` (quick fix "
            "available) or an htam.toml [[kernel]] entry"
        ),
        severity=t.DiagnosticSeverity.Information,
        source=SOURCE,
        code="unbound",
    )


def map_line(candidate: str, current: str, line: int) -> int:
    """The line of `current` that corresponds to 0-based `line` of `candidate`."""
    matcher = difflib.SequenceMatcher(
        None, candidate.splitlines(), current.splitlines(), autojunk=False
    )
    for tag, c1, c2, d1, _d2 in matcher.get_opcodes():
        if c1 <= line < c2 or (tag == "insert" and c1 == line):
            return d1 + (line - c1 if tag == "equal" else 0)
    return max(len(current.splitlines()) - 1, 0)


def _compile_diagnostic(
    ls: Any, doc: Document, candidate: str, line: int, message: str
) -> t.Diagnostic:
    row = min(map_line(candidate, doc.text, max(line - 1, 0)), doc.index.line_count - 1)
    start = doc.index.starts[row]
    end = start + len(doc.index.line_bytes(row))
    excerpt = message.strip().splitlines()[0] if message.strip() else "compile error"
    return t.Diagnostic(
        range=ls.lsp_range(doc, start, end),
        message=f"HTAM: the last candidate failed to compile here (its line {line}): {excerpt}",
        severity=t.DiagnosticSeverity.Error,
        source=SOURCE,
        code="candidate_compile_error",
    )


# --- code actions -------------------------------------------------------------------------


def code_actions(ls: Any, doc: Document, offset: int) -> list[t.CodeAction]:
    unit = discovery.unit_at(doc, offset)
    found: list[t.CodeAction] = []
    if insight.needs_binding(doc):
        target = unit or next((u for u in discovery.units(doc) if u.kind == "global"), None)
        if target is not None:
            found.append(binding_action(ls, doc, target))
    if unit is None:
        return found
    found += suggestion_actions(ls, doc, unit)
    found += run_actions(ls, doc, unit)
    return found


def binding_action(ls: Any, doc: Document, unit: Unit) -> t.CodeAction:
    directive = insight.binding_directive(doc, unit, discovery.units(doc))
    start = t.Position(0, 0)
    return t.CodeAction(
        title=f"HTAM: bind to its reference ({directive.strip()})",
        kind=t.CodeActionKind.QuickFix,
        diagnostics=[_unbound_diagnostic(ls, doc, unit)],
        is_preferred=True,
        edit=t.WorkspaceEdit(
            changes={doc.uri: [t.TextEdit(range=t.Range(start, start), new_text=directive)]}
        ),
    )


def suggestion_actions(ls: Any, doc: Document, unit: Unit) -> list[t.CodeAction]:
    """One action per strategy whose candidate clears the threshold; the fastest preferred.
    `data` carries the numbers, so that clients never read them out of the title."""
    graph = ls.graph(insight.backend(doc))
    resolves_edit = "edit" in (
        ls.caps("text_document.code_action.resolve_support.properties") or []
    )
    tags = _tag_support(ls)
    found = []
    for rank, s in enumerate(offered(ls, doc).suggestions):
        record = s.record
        data = {"uri": doc.uri, "kernel": unit.name, **suggestion_facts(record)}
        node = graph.locals.get(record.step.local_id)
        action = t.CodeAction(
            title=render.action_title(graph, record, _also(graph, doc, s)),
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


def suggestion_facts(record: sg.StepRecord) -> dict[str, Any]:
    """The machine-readable facts of a suggestion (`CodeAction.data`)."""
    step = record.step
    return {
        "n": record.n,
        "globalId": step.global_id,
        "localId": step.local_id,
        "speedup": record.speedup,
        "speedupLow": record.low,
        "speedupHigh": record.high,
        "refSpeedup": step.ref_speedup,
        "startMs": record.start_ms,
        "runtimeMs": record.runtime_ms,
        "refMs": record.ref_ms,
        "inputs": record.inputs,
        "nonPortable": record.non_portable,
        "sandbox": step.verdict.get("sandbox"),
    }


def _also(graph: Any, doc: Document, suggestion: sg.Suggestion) -> list[str]:
    """Static features the whole edit adds that its strategy's name does not already say
    (e.g. a flags strategy that also adds __restrict__: "restrict pointers")."""
    key = f"also:{suggestion.record.n}"
    if key not in doc.cache:
        back = insight.backend(doc)
        before = parsing.features(doc.source, back)
        after = parsing.features(encode(applied_text(doc, suggestion)), back)
        name = render.node_name(graph, suggestion.record.step.local_id).lower()
        gained = sorted(tag for tag in after - before if not tag.startswith("no_"))
        doc.cache[key] = [tag.replace("_", " ") for tag in gained if not _said(tag, name)]
    cached: list[str] = doc.cache[key]
    return cached


def _said(tag: str, name: str) -> bool:
    """Whether a strategy's name already says what the feature tag says."""
    words = [w for w in tag.lower().split("_") if w not in ("opt", "loads", "pointers")]
    return all(w in name for w in words)


def _tag_support(ls: Any) -> bool:
    values = ls.caps("text_document.code_action.tag_support.value_set") or []
    return t.CodeActionTag.LlmGenerated in values


def suggestion_edit(ls: Any, doc: Document, data: dict[str, Any]) -> t.WorkspaceEdit:
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
    start, old_end, replacement = _minimal_change(old, new)
    edit = t.TextEdit(
        range=ls.lsp_range(doc, base + start, base + old_end),
        new_text=replacement.decode("utf-8", "surrogatepass"),
    )
    return _workspace_edit(ls, doc, edit, chosen.record)


def _workspace_edit(
    ls: Any, doc: Document, edit: t.TextEdit, record: sg.StepRecord
) -> t.WorkspaceEdit:
    """The edit, labelled with its speedup where the client supports change annotations
    (VS Code's refactor preview, Ctrl+Enter in the light bulb, shows the diff and label).
    It does not need confirmation: accepting stays one step and one undo."""
    if not (
        ls.caps("workspace.workspace_edit.change_annotation_support")
        and ls.caps("workspace.workspace_edit.document_changes")
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


def _minimal_change(old: bytes, new: bytes) -> tuple[int, int, bytes]:
    """(start, end in old, replacement): old[:start] + replacement + old[end:] == new."""
    limit = min(len(old), len(new))
    prefix = 0
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    while prefix > 0 and prefix < len(old) and (old[prefix] & 0xC0) == 0x80:
        prefix -= 1  # keep whole UTF-8 sequences
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    while suffix > 0 and (old[len(old) - suffix] & 0xC0) == 0x80:
        suffix -= 1
    return prefix, len(old) - suffix, new[prefix : len(new) - suffix]


def run_actions(ls: Any, doc: Document, unit: Unit) -> list[t.CodeAction]:
    """Run the next step; or, where the client shows them, why strategies cannot run."""
    reasons = blocked_reasons(ls, doc)
    found = []
    argument = {
        "uri": doc.uri,
        "position": _position_json(ls.lsp_range(doc, unit.name_start, unit.name_end).start),
    }
    if not reasons.get("all"):
        found.append(
            t.CodeAction(
                title=f"HTAM: run the next optimization step on {unit.name}",
                kind=ACTION_KIND,
                command=t.Command("HTAM: next step", "htam.nextStep", arguments=[argument]),
            )
        )
    elif reasons.get("check"):
        found.append(
            t.CodeAction(
                title=f"HTAM: compile-check {unit.name} with nvcc ({reasons['check']})",
                kind=f"{ACTION_KIND}.check",
                command=t.Command("HTAM: compile check", "htam.compileCheck", arguments=[argument]),
            )
        )
    if not ls.caps("text_document.code_action.disabled_support"):
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


def blocked_reasons(ls: Any, doc: Document) -> dict[str, str]:
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


def provider(ls: Any) -> tuple[str, str]:
    """The provider a step would use: the last job's word, else the settings and the
    server's environment (where editors put API keys), read without loading any SDK."""
    if ls.provider is not None:
        return ls.provider.provider, ls.provider.provider_reason
    settings = ls.settings
    if settings.provider != "auto":
        return settings.provider, f"provider setting is {settings.provider}"
    from htam_engine.llm.choice import choose_provider

    cassette = Path(settings.cassette) if settings.cassette else None
    return choose_provider(settings.base_url, cassette, os.environ)


# --- results ------------------------------------------------------------------------------


def results(ls: Any, doc: Document, unit: Unit) -> dict[str, Any]:
    """htam.results: the kernel's whole trajectory, what is offered now (with the line
    each suggestion starts on, for a quickfix list) and the last run's speedup plot."""
    graph = ls.graph(insight.backend(doc))
    history = ls.records.history(doc.uri)
    offer = offered(ls, doc)
    listed = [
        {
            "title": render.action_title(graph, s.record, _also(graph, doc, s)),
            "line": _first_changed_line(doc, s),
            **suggestion_facts(s.record),
        }
        for s in offer.suggestions
    ]
    plot = ls.jobs.last_plot(doc.uri)
    parts = render.ResultsParts(unit.name, history, [s["title"] for s in listed], plot)
    markdown = render.results_markdown(graph, parts, _notes(ls, graph, offer))
    return {"markdown": markdown, "kernel": unit.name, "suggestions": listed, "plot": plot}


def _first_changed_line(doc: Document, suggestion: sg.Suggestion) -> int:
    text = doc.text
    old, new = encode(text[suggestion.start : suggestion.end]), encode(suggestion.new)
    start, _end, _new = _minimal_change(old, new)
    return doc.index.point(len(encode(text[: suggestion.start])) + start)[0]


# --- memory -------------------------------------------------------------------------------


def memory_summary(graph: Any) -> dict[str, Any]:
    """htam.showMemory: the directions' statistics and the most used transitions."""
    directions = [{"id": g.id, "name": g.name, **_stats(g.stats)} for g in graph.globals.values()]
    edges = sorted(graph.edges.values(), key=lambda e: e.stats.weight, reverse=True)[:10]
    transitions = [{"src": e.src, "dst": e.dst, "prior": e.prior, **_stats(e.stats)} for e in edges]
    lines = [
        f"### HTAM memory ({graph.backend})",
        "",
        "| direction | attempts | correct | improved | mean reward |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {d['name']} | {d['attempts']} | {d['correct']} | {d['improved']} "
        f"| {d['mean_reward']:+.3f} |"
        for d in directions
    ]
    return {
        "markdown": "\n".join(lines) + "\n",
        "memory": {"backend": graph.backend, "directions": directions, "transitions": transitions},
    }


def _stats(stats: Any) -> dict[str, Any]:
    return {
        "attempts": stats.attempts,
        "correct": stats.correct,
        "improved": stats.improved,
        "weight": stats.weight,
        "mean_reward": stats.mean_reward,
    }
