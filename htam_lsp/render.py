"""Text the editor shows: code action and lens titles, and the hover's Markdown rationale."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

DIFF_LINES = 80
TOP_DIRECTIONS = 5


def node_name(graph: Any, node_id: str) -> str:
    """The display name of a global or local node (its id when the memory lacks it)."""
    if graph is not None:
        node = graph.globals.get(node_id) or graph.locals.get(node_id)
        if node is not None:
            return str(node.name)
    return node_id or "?"


def speedup(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def action_title(graph: Any, global_id: str, local_id: str, gain: float | None, inputs: int) -> str:
    """`HTAM: apply Data Reuse -> shared-memory tiling (1.84x measured, correct on 3 inputs)`."""
    measured = f"{gain:.2f}x measured" if gain is not None else "speedup not measured"
    checked = f"correct on {inputs} input{'s' if inputs != 1 else ''}" if inputs else "correct"
    return (
        f"HTAM: apply {node_name(graph, global_id)} -> {node_name(graph, local_id)} "
        f"({measured}, {checked})"
    )


def best_lens_title(graph: Any, step: dict[str, Any]) -> str:
    """`Best: 1.84x measured (Data Reuse -> shared-memory tiling)`; says so when no
    measured candidate beats the current code yet."""
    move = (
        f"{node_name(graph, step.get('global', ''))} -> {node_name(graph, step.get('local', ''))}"
    )
    gain = step.get("speedup")
    if gain is not None and gain <= 1.0:
        return f"No faster candidate yet (best {speedup(gain)} measured: {move})"
    return f"Best: {speedup(gain)} measured ({move})"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def directions_table(graph: Any, decision: dict[str, Any], chosen: str | None) -> list[str]:
    """The top directions by probability with score and triggers; `chosen` always shown."""
    candidates = sorted(
        decision.get("candidates", []), key=lambda c: c.get("probability", 0.0), reverse=True
    )
    shown = candidates[:TOP_DIRECTIONS]
    shown += [c for c in candidates[TOP_DIRECTIONS:] if c.get("id") == chosen]
    lines = ["| direction | score | p | triggers matched |", "|---|---:|---:|---|"]
    for c in shown:
        name = node_name(graph, c.get("id", ""))
        if c.get("id") == chosen:
            name = f"**{name}** (chosen)"
        matches = ", ".join(c.get("trigger_matches", [])) or "-"
        lines.append(
            f"| {_cell(name)} | {c.get('score', 0.0):+.3f} | {c.get('probability', 0.0):.2f} "
            f"| {_cell(matches)} |"
        )
    return lines


def transition_evidence(graph: Any, decision: dict[str, Any]) -> list[str]:
    """Edge terms of the chosen direction: alpha, evidence count, mean, prior, utility."""
    chosen = next(
        (c for c in decision.get("candidates", []) if c.get("id") == decision.get("chosen")), None
    )
    if chosen is None:
        return []
    prefix = " -> ".join(node_name(graph, p) for p in decision.get("prefix", [])) or "START"
    lines = [f"Prefix: {prefix}; temperature {decision.get('temperature', 0.0):g}"]
    for term in chosen.get("edge_terms", []):
        lines.append(
            f"- `{node_name(graph, term.get('src', ''))} -> {node_name(graph, chosen['id'])}` "
            f"(k={term.get('k')}): alpha {term.get('alpha', 0.0):.2f}, n={term.get('n', 0):g}, "
            f"mean {term.get('mean', 0.0):+.3f}, prior {term.get('prior', 0.0):+.2f}, "
            f"U {term.get('utility', 0.0):+.3f} -> {term.get('contribution', 0.0):+.3f}"
        )
    lines.append(
        f"- direction itself: n={chosen.get('node_n', 0):g}, "
        f"mean {chosen.get('node_mean', 0.0):+.3f}, "
        f"U {chosen.get('node_utility', 0.0):+.3f}; trigger {chosen.get('trigger', 0.0):.2f} "
        f"({len(chosen.get('trigger_matches', []))}/{chosen.get('trigger_total', 0)})"
    )
    return lines


def _top(decision: dict[str, Any]) -> dict[str, Any]:
    """The decision as if its most probable direction had been drawn (for the preview)."""
    candidates = decision.get("candidates", [])
    if not candidates:
        return decision
    best = max(candidates, key=lambda c: c.get("probability", 0.0))
    return {**decision, "chosen": best.get("id")}


def strategy_notes(graph: Any, step: dict[str, Any]) -> list[str]:
    """The local strategy's reason, and the risks and checks the memory holds for it."""
    lines = [
        f"**Strategy:** {node_name(graph, step.get('local', ''))}: "
        f"{step.get('reason') or 'no reason recorded'}"
    ]
    if graph is None:
        return lines
    direction = graph.globals.get(step.get("global", ""))
    local = graph.locals.get(step.get("local", ""))
    if direction is not None and direction.risks:
        lines.append(f"- Risks: {'; '.join(direction.risks)}")
    if local is not None and local.checks:
        lines.append(f"- Checks: {'; '.join(local.checks)}")
    return lines


def history_table(graph: Any, history: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| # | when | direction -> strategy | outcome | vs start | vs PyTorch |",
        "|---:|---|---|---|---:|---:|",
    ]
    for step in history[-10:]:
        verdict = step.get("verdict", {})
        when = datetime.fromtimestamp(step.get("time", 0)).strftime("%m-%d %H:%M")
        move = (
            f"{node_name(graph, step.get('global', ''))} -> "
            f"{node_name(graph, step.get('local', ''))}"
        )
        lines.append(
            f"| {step.get('n', '')} | {when} | {_cell(move)} | {_cell(step.get('status', ''))} "
            f"| {speedup(step.get('speedup'))} "
            f"| {speedup(verdict.get('speedup') if verdict.get('correct') else None)} |"
        )
    return lines


def unified_diff(current: str, suggested: str, name: str) -> list[str]:
    """A unified diff of the suggestion against the current text, cut to DIFF_LINES."""
    diff = list(
        difflib.unified_diff(
            current.splitlines(),
            suggested.splitlines(),
            f"a/{name}",
            f"b/{name}",
            lineterm="",
            n=2,
        )
    )
    if len(diff) > DIFF_LINES:
        diff = [*diff[:DIFF_LINES], f"... ({len(diff) - DIFF_LINES} more lines)"]
    return ["```diff", *(line.replace("```", "` ``") for line in diff), "```"]


def hover_markdown(
    title: str,
    graph: Any,
    record: dict[str, Any] | None,
    diff: list[str] | None,
    preview: tuple[str, dict[str, Any]] | None,
) -> str:
    """The hover: the last decision's rationale and history, or the memory's current view."""
    lines = [f"### HTAM: {title}", ""]
    history = (record or {}).get("history", [])
    if history:
        last = history[-1]
        decision = last.get("decision") or {}
        lines += [f"**Last step** ({last.get('status', '?')}):", ""]
        lines += [*directions_table(graph, decision, decision.get("chosen")), ""]
        lines += ["**Transition evidence**", "", *transition_evidence(graph, decision), ""]
        lines += [*strategy_notes(graph, last), ""]
        lines += ["**Measured history**", "", *history_table(graph, history), ""]
    elif preview is not None:
        state_text, decision = preview
        lines += ["No HTAM run yet. The memory's current top directions for this kernel:", ""]
        lines += [*directions_table(graph, decision, None), ""]
        lines += ["**Why, from the memory's transitions (from START)**", ""]
        lines += [*transition_evidence(graph, _top(decision)), ""]
        lines += ["```text", state_text, "```", ""]
    if diff:
        lines += ["**Suggestion** (best verified candidate vs the current text)", "", *diff]
    return "\n".join(lines).rstrip() + "\n"
