"""Text the editor shows: code action and lens titles, and the hover's Markdown rationale."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from htam_engine import events
from htam_engine.decisions import GlobalDecision
from htam_engine.formatting import format_bounded, format_bounds, format_duel, format_speedup
from htam_engine.roofline import describe
from htam_lsp.suggestions import StepRecord

if TYPE_CHECKING:
    from htam_engine.memory.model import Graph

DIFF_LINES = 80
TOP_DIRECTIONS = 5
PHASE_WORDS = {  # a step's phases (`Step.phases`), in order, as the user knows them
    "select": "choosing a strategy",
    "generate": "writing the candidate (model wait)",
    "compile": "compiling",
    "verify": "checking correctness",
    "time": "timing",
    "confirm": "confirming in pairs",
    "update": "learning",
}
_MARKUP = re.compile(r"([\\`*_\[\]<])")  # what Markdown would read as markup


def node_name(graph: Graph, node_id: str) -> str:
    """The display name of a global or local node (its id when the memory lacks it)."""
    if graph is not None:
        node = graph.globals.get(node_id) or graph.locals.get(node_id)
        if node is not None:
            return str(node.name)
    return node_id or "?"


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def interval_text(record: StepRecord) -> str:
    """The engine's paired claim by its one formatter, naming what it was timed against:
    `1.46x (95 % 1.41-1.52)` against the code its job started from, `1.20x (95 %
    1.10-1.31) vs #3` against an earlier candidate; a step never timed in pairs gives its
    estimate, labelled: `est. 1.39x`."""
    claim = record.claim
    if claim is None:
        return f"est. {format_speedup(record.estimate)}"
    text = format_bounded(claim.speedup, claim.bounds)
    return text if claim.versus == 0 else f"{text} vs #{claim.versus}"


def gain_text(record: StepRecord) -> str:
    """What a confirmed candidate gains: `1.46x faster than your code (95 % 1.41-1.52;
    0.42 -> 0.29 ms; PyTorch 0.25 ms)`, in pairs against the code its job started from,
    or against the best so far (itself confirmed faster), the other only estimated. For
    anything else, what the engine said instead."""
    claim = record.claim
    if claim is None or not claim.confirmed:
        return unconfirmed_text(record)
    ref = f"; PyTorch {_ms(record.ref_ms)} ms" if record.ref_ms is not None else ""
    bounds = format_bounds(claim.bounds)
    light = describe(record.step.verdict.roofline, short=True)  # "at 61 % of this core's ..."
    light = f", {light}" if light else ""
    if claim.versus == 0:
        times = f"{_ms(record.start_ms)} -> {_ms(record.runtime_ms)} ms"
        return (
            f"{format_speedup(claim.speedup)} faster than your code ({bounds}; {times}{ref})"
            + light
        )
    return (
        f"{format_speedup(claim.speedup)} faster than #{claim.versus}, which beat your code "
        f"({bounds}, in pairs; est. {format_speedup(record.estimate)} over your code{ref})" + light
    )


def unconfirmed_text(record: StepRecord) -> str:
    """One number for one verdict: `not confirmed faster: 0.96x (95 % 0.64-1.42) vs your
    code, in pairs`, `slower: 0.63x (95 % 0.60-0.66) vs your code, in pairs`, or, for a
    step never timed in pairs, `not timed in pairs (est. 1.39x)` / `slower (est. 0.63x, not
    timed in pairs)`."""
    claim = record.claim
    if claim is None:
        estimate = f"est. {format_speedup(record.estimate)}"
        slower = record.estimate is not None and record.estimate < 1.0
        return (
            f"slower ({estimate}, not timed in pairs)"
            if slower
            else f"not timed in pairs ({estimate})"
        )
    against = "your code" if claim.versus == 0 else f"#{claim.versus}"
    said = format_bounded(claim.speedup, claim.bounds)
    verdict = "slower" if claim.high < 1.0 else "not confirmed faster"
    return f"{verdict}: {said} vs {against}, in pairs"


def below_text(record: StepRecord, threshold: float) -> str:
    """Why a measured candidate is not offered: `best 1.15x (95 % 1.02-1.30): the lower
    bound of its 95 % interval is under 1.10x`, or the closest one's verdict when the
    engine did not confirm it faster (never called "best")."""
    if not record.confirmed:
        return f"closest: {unconfirmed_text(record)}"
    return (
        f"best {interval_text(record)}: the lower bound of its 95 % interval is under "
        f"{format_speedup(threshold)}"
    )


def move(graph: Graph, step: events.Step) -> str:
    """`Data Reuse -> shared-memory tiling`."""
    return f"{node_name(graph, step.global_id)} -> {node_name(graph, step.local_id)}"


def action_title(graph: Graph, record: StepRecord) -> str:
    """Short enough for any code action menu: `HTAM: apply Data Reuse -> tiling: 1.46x
    faster (95 % 1.41-1.52)`, edits that hold only on this machine labelled, like ruff's
    unsafe fixes. What it measured and changed: `suggestion_text`, the hover, the diff."""
    label = f" [non-portable: {', '.join(record.non_portable)}]" if record.non_portable else ""
    claim = record.claim
    gain = unconfirmed_text(record)
    if claim is not None and claim.confirmed:
        than = "" if claim.versus == 0 else f" than #{claim.versus}"
        gain = f"{format_speedup(claim.speedup)} faster{than} ({format_bounds(claim.bounds)})"
    return f"HTAM: apply {move(graph, record.step)}{label}: {gain}"


def suggestion_text(graph: Graph, record: StepRecord, also: Sequence[str]) -> str:
    """`Data Reuse -> tiling: 1.46x faster than your code (95 % 1.41-1.52; 0.42 -> 0.29
    ms; PyTorch 0.25 ms), correct on 3 inputs; also adds <what else the edit adds>`."""
    inputs = record.inputs
    checked = f"correct on {inputs} input{'s' if inputs != 1 else ''}" if inputs else "correct"
    text = f"{move(graph, record.step)}: {gain_text(record)}, {checked}"
    return f"{text}; also adds {', '.join(also)}" if also else text


def best_lens_title(
    graph: Graph, record: StepRecord | None, slower: StepRecord | None, threshold: float
) -> str | None:
    """`Best: 1.46x faster (95 % 1.41-1.52; 0.42 -> 0.29 ms) (Data Reuse -> tiling)` for
    the best offered suggestion; else says that nothing measured beats the current code,
    and why the best measured one is not offered."""
    if record is not None:
        return f"Best: {gain_text(record)} ({move(graph, record.step)})"
    if slower is not None:
        return f"HTAM: no faster candidate yet ({below_text(slower, threshold)})"
    return None


def best_slower(records: Sequence[StepRecord]) -> StepRecord | None:
    """The measured candidate that came closest to being offered: confirmed ones first,
    then by the engine's paired number, then by the estimate."""

    def closeness(r: StepRecord) -> tuple[bool, float, float]:
        return r.confirmed, r.claim.speedup if r.claim else 0.0, r.estimate or 0.0

    return max(records, key=closeness, default=None)


def md(text: Any) -> str:
    """Free text (a reason, a compiler message) as Markdown that shows it as written:
    `__restrict__` stays `__restrict__`, never a bold "restrict"."""
    return _MARKUP.sub(r"\\\1", str(text))


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def directions_table(
    graph: Graph, decision: GlobalDecision | None, chosen: str | None
) -> list[str]:
    """The top directions by probability with score and triggers; `chosen` always shown."""
    found = decision.candidates if decision else []
    candidates = sorted(found, key=lambda c: c.probability, reverse=True)
    shown = candidates[:TOP_DIRECTIONS]
    shown += [c for c in candidates[TOP_DIRECTIONS:] if c.id == chosen]
    lines = ["| direction | score | p | triggers matched |", "|---|---:|---:|---|"]
    for c in shown:
        name = md(node_name(graph, c.id))
        if c.id == chosen:
            name = f"**{name}** (chosen)"
        matches = md(", ".join(c.trigger_matches) or "-")
        lines.append(f"| {_cell(name)} | {c.score:+.3f} | {c.probability:.2f} | {_cell(matches)} |")
    return lines


def transition_evidence(graph: Graph, decision: GlobalDecision | None) -> list[str]:
    """Edge terms of the chosen direction: alpha, evidence count, mean, prior, utility."""
    if decision is None:
        return []
    chosen = next((c for c in decision.candidates if c.id == decision.chosen), None)
    if chosen is None:
        return []
    prefix = " -> ".join(node_name(graph, p) for p in decision.prefix) or "START"
    lines = [f"Prefix: {prefix}; temperature {decision.temperature:g}"]
    for term in chosen.edge_terms:
        lines.append(
            f"- `{node_name(graph, term.src)} -> {node_name(graph, chosen.id)}` "
            f"(k={term.k}): alpha {term.alpha:.2f}, n={term.n:g}, "
            f"mean {term.mean:+.3f}, prior {term.prior:+.2f}, "
            f"U {term.utility:+.3f} -> {term.contribution:+.3f}"
        )
    lines.append(
        f"- direction itself: n={chosen.node_n:g}, mean {chosen.node_mean:+.3f}, "
        f"U {chosen.node_utility:+.3f}; trigger {chosen.trigger:.2f} "
        f"({len(chosen.trigger_matches)}/{chosen.trigger_total})"
    )
    return lines


def _top(decision: GlobalDecision) -> GlobalDecision:
    """The decision as if its most probable direction had been drawn (for the preview)."""
    if not decision.candidates:
        return decision
    best = max(decision.candidates, key=lambda c: c.probability)
    return replace(decision, chosen=best.id)


def strategy_notes(graph: Graph, step: events.Step) -> list[str]:
    """The local strategy's reason, and the risks and checks the memory holds for it."""
    reason = step.reason or "no reason recorded"
    lines = [f"**Strategy:** {md(node_name(graph, step.local_id))}: {md(reason)}"]
    if graph is None:
        return lines
    direction = graph.globals.get(step.global_id)
    local = graph.locals.get(step.local_id)
    if direction is not None and direction.risks:
        lines.append(f"- Risks: {md('; '.join(direction.risks))}")
    if local is not None and local.checks:
        lines.append(f"- Checks: {md('; '.join(local.checks))}")
    return lines


def outcome(step: events.Step) -> str:
    """The step's status, with the engine's own reason when it failed, or the sizes where
    a candidate right at the task's shape only is wrong."""
    if step.correct and step.verdict.shape_only:
        return f"{step.status}: correct at the task's shape only"
    why = (step.error.message if step.error else "").strip().splitlines()
    return f"{step.status}: {why[0][:120]}" if why and not step.correct else step.status


def history_table(graph: Graph, history: Sequence[StepRecord], last: int = 10) -> list[str]:
    lines = [
        "| # | when | direction -> strategy | outcome | vs your code | vs best, in pairs "
        "| vs PyTorch |",
        "|---:|---|---|---|---:|---:|---:|",
    ]
    for record in history[-last:]:
        step = record.step
        when = datetime.fromtimestamp(record.time).strftime("%m-%d %H:%M")
        gain = _versus_start(record) if step.correct else format_speedup(None)
        lines.append(
            f"| {record.n} | {when} | {_cell(md(move(graph, step)))} | {_cell(md(outcome(step)))} "
            f"| {gain} | {format_duel(step.versus_best)} | {format_speedup(step.ref_speedup)} |"
        )
    return lines


def _versus_start(record: StepRecord) -> str:
    """The history's "vs your code": the paired number where the engine timed it against
    the start, else the estimate, labelled."""
    if record.paired and record.claim is not None:
        return format_bounded(record.claim.speedup, record.claim.bounds)
    return "-" if record.estimate is None else f"est. {format_speedup(record.estimate)}"


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


@dataclass(frozen=True)
class HoverParts:
    """What the hover of one kernel shows."""

    title: str
    history: Sequence[StepRecord]
    diff: list[str] | None = None
    preview: tuple[str, GlobalDecision] | None = None
    notes: Sequence[str] = ()
    offered: str | None = None  # the best suggestion, as `suggestion_text` says it


def hover_markdown(graph: Graph, parts: HoverParts) -> str:
    """The hover, the user's answer first: what is offered (measured speedup, what
    changed), then the measured history, then why the engine chose what it did."""
    lines = [f"### HTAM: {parts.title}", ""]
    if parts.offered:
        lines += [f"**Offered:** {md(parts.offered)}", ""]
    lines += [f"*{md(note)}*" for note in parts.notes]
    if parts.notes:
        lines.append("")
    if parts.diff:
        lines += ["**What changes** (best verified candidate vs the current text)", "", *parts.diff]
        lines.append("")
    if parts.history:
        last = parts.history[-1].step
        decision = last.decision
        lines += ["**Measured history**", "", *history_table(graph, parts.history), ""]
        lines += [f"**Last step** ({md(outcome(last))}), and why it was chosen:", ""]
        lines += [*strategy_notes(graph, last), ""]
        lines += [*directions_table(graph, decision, decision.chosen if decision else None), ""]
        lines += ["**Transition evidence**", "", *transition_evidence(graph, decision), ""]
    elif parts.preview is not None:
        state_text, decision = parts.preview
        lines += ["No HTAM run yet. The memory's current top directions for this kernel:", ""]
        lines += [*directions_table(graph, decision, None), ""]
        lines += ["**Why, from the memory's transitions (from START)**", ""]
        lines += [*transition_evidence(graph, _top(decision)), ""]
        lines += ["```text", state_text, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


@dataclass(frozen=True)
class ResultsParts:
    """What the results view of one kernel shows."""

    kernel: str
    history: Sequence[StepRecord]
    offered: Sequence[str]  # the titles of the actions offered now
    plot: str | None  # the plot of every step (a PNG path)


def results_markdown(graph: Graph, parts: ResultsParts, notes: Sequence[str]) -> str:
    """Every measured step of the kernel, what can be applied now, and the plot."""
    steps = parts.history
    correct = [r for r in steps if r.step.correct]
    confirmed = [r for r in correct if r.confirmed and r.paired and r.claim is not None]
    best = max(confirmed, key=lambda r: r.claim.low if r.claim else 0.0, default=None)
    said = (
        f"best {interval_text(best)} over the code it started from, in pairs"
        if best
        else ("none confirmed faster than the code it started from")
    )
    lines = [f"### HTAM results: `{parts.kernel}`", ""]
    lines.append(
        f"{len(steps)} step(s), {len(correct)} correct; {said}."
        if steps
        else "No step has run on this kernel yet."
    )
    lines += ["", "**Offered now**", ""]
    lines += [f"- {md(title)}" for title in parts.offered] or ["- nothing"]
    lines += ["", *(f"*{md(note)}*" for note in notes)]
    if parts.plot:
        lines += ["", f"![speedup per step]({Path(parts.plot).as_uri()})"]
    if steps:
        lines += ["", *history_table(graph, steps, last=len(steps))]
    lines += time_lines(steps)
    return "\n".join(lines).rstrip() + "\n"


def time_lines(history: Sequence[StepRecord]) -> list[str]:
    """Where the steps' wall time went, summed over every step of the kernel, each phase
    named as the user knows it (`generate`: waiting for the model or a mechanical rewrite)."""
    total: dict[str, float] = {}
    for record in history:
        for phase, seconds in record.step.phases.items():
            total[phase] = total.get(phase, 0.0) + seconds
    if not total:
        return []
    spent = sum(total.values())
    order = [p for p in PHASE_WORDS if p in total] + sorted(set(total) - set(PHASE_WORDS))
    lines = ["", f"**Where the time went** ({spent:.0f} s over {len(history)} step(s))", ""]
    lines += ["| phase | seconds | share |", "|---|---:|---:|"]
    for phase in order:
        name = PHASE_WORDS.get(phase, phase)
        lines.append(f"| {name} | {total[phase]:.1f} | {total[phase] / spent:.0%} |")
    return lines
