"""What a run leaves behind: the best implementation, a Markdown report, a plot, the trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from htam_engine.formatting import (
    format_bounded,
    format_compile,
    format_duel,
    format_interval,
    format_roofline,
    format_speedup,
)
from htam_engine.placement import Placement

if TYPE_CHECKING:
    from htam_engine.loop import RunResult


def write_outputs(result: RunResult, folder: Path, suffix: str = ".py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"best{suffix}").write_text(result.best_source)
    (folder / "trajectory.json").write_text(json.dumps(result.to_json(), indent=2))
    (folder / "report.md").write_text(markdown_report(result))
    plot_speedups(result, folder / "speedup.png")
    return folder


def markdown_report(result: RunResult) -> str:
    lines = [
        f"# HTAM run {result.run_id}: {result.task}",
        "",
        f"- backend: {result.backend}; provider: {result.provider}; stopped: {result.stopped}",
        f"- starting implementation: {format_speedup(result.start_ref_speedup)} vs PyTorch",
        f"- best (step {result.best_step}): {_best_over_start(result)} over the start, "
        f"{format_speedup(result.best_ref_speedup)} vs PyTorch",
        *_light_lines(result),
        "",
        "| step | direction | strategy | reason | outcome | vs start | vs best, in pairs "
        "| vs PyTorch | of roofline | runtime ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s, over_start in zip(result.steps, versus_start(result), strict=True):
        runtime = s.verdict.runtime_ms
        shown = "-" if runtime is None else f"{runtime:.3f}"
        lines.append(
            f"| {s.step} | {s.global_id} | {s.local_id} | {s.reason.replace('|', '/')} "
            f"| {s.status} | {over_start} | {format_duel(s.versus_best)} "
            f"| {format_interval(s.verdict)} | {format_roofline(s.verdict)} | {shown} |"
        )
    return "\n".join([*lines, *phase_lines(result)]) + "\n"


PHASE_ORDER = ("select", "generate", "compile", "verify", "time", "confirm", "update")


def phase_lines(result: RunResult) -> list[str]:
    """Where the run's wall time went: seconds per phase of the start, each step and the
    closing duel of the best against the start (a re-timed evaluation adds to its phases)."""
    rows = [("start", result.start_phases)]
    rows += [(str(s.step), s.phases) for s in result.steps]
    rows += [("best vs start", result.closing_phases)]
    rows = [(name, phases) for name, phases in rows if phases]
    if not rows:
        return []
    names = [p for p in PHASE_ORDER if any(p in phases for _, phases in rows)]
    names += sorted({p for _, phases in rows for p in phases} - set(names))
    lines = ["", "## Where the time went (wall seconds)", ""]
    lines += ["| step | " + " | ".join(names) + " | total |"]
    lines += ["| --- |" + " ---: |" * (len(names) + 1)]
    for name, phases in rows:
        cells = [f"{phases[p]:.1f}" if p in phases else "-" for p in names]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {sum(phases.values()):.1f} |")
    return lines


def _light_lines(result: RunResult) -> list[str]:
    """The start's and PyTorch's place on the roofline, and torch.compile's numbers."""
    from htam_engine.roofline import describe

    lines = []
    light = result.start_verdict.roofline if result.start_verdict else None
    if isinstance(light, Placement):
        # a placement stored before special functions were counted has no count
        special = "" if light.special_ops is None else f"{light.special_ops} special functions, "
        lines.append(
            f"- roofline ({light.where}, {light.bound}-bound: {light.bytes} bytes, "
            f"{light.flops} FLOPs, {special}at best {light.roofline_ms:.4g} ms): the start is "
            f"{describe(light)}; PyTorch at {100 * (light.reference_fraction or 0):.0f} %"
        )
    timed = [
        (result.start_verdict, "start"),
        *((s.verdict, f"step {s.step}") for s in result.steps),
    ]
    for verdict, name in timed:
        if verdict is not None and verdict.compile_baseline:
            lines.append(f"- vs torch.compile ({name}): {format_compile(verdict)}")
    return lines


def versus_start(result: RunResult) -> list[str]:
    """Each step's speedup over the start, one number a step: timed in pairs where the
    engine did that (its duel while the start was still the best, or the run's best
    re-timed against the start), else the ratio of two speedups over PyTorch, labelled
    as the estimate it is (`est. 3.94x`)."""
    cells = []
    for s in result.steps:
        duel = s.versus_best
        if s.step == result.best_step and result.best_interval:
            cells.append(format_bounded(result.best_speedup, result.best_interval))
        elif duel is not None and duel.against == 0 and duel.speedup is not None:
            cells.append(format_bounded(duel.speedup, duel.bounds))
        else:
            cells.append("-" if s.speedup is None else f"est. {format_speedup(s.speedup)}")
    return cells


def _best_over_start(result: RunResult) -> str:
    """The run's best over its start: in pairs where timed so, else labelled an estimate."""
    if result.best_interval or result.best_speedup is None or result.best_step == 0:
        return format_bounded(result.best_speedup, result.best_interval)
    return f"est. {format_speedup(result.best_speedup)}"


def plot_speedups(result: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [0] + [s.step for s in result.steps]
    measured = [1.0] + [s.speedup if s.speedup is not None else float("nan") for s in result.steps]
    best, running = [], 1.0
    for value in measured:
        running = max(running, value) if value == value else running  # NaN-safe
        best.append(running)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, measured, "o", label="candidate (correct only)")
    ax.step(steps, best, where="post", label="best so far (vs PyTorch ratios)")
    if result.best_interval and result.best_speedup is not None:  # the paired claim
        low, high = result.best_interval
        ax.errorbar(
            [result.best_step], [result.best_speedup],
            yerr=[[result.best_speedup - low], [high - result.best_speedup]],
            fmt="D", color="black", capsize=4, label="best, timed in pairs vs start (95 %)",
        )  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="step", ylabel="speedup over start", title=f"HTAM: {result.task}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
