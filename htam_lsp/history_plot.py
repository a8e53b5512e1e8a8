"""The results view's plot: every measured step of a kernel, over all its jobs.

Drawn from the kernel's records (kept in the memory store, so across restarts), into the
HTAM home; a file per history, so that an unchanged history is not drawn again.
matplotlib is imported only when a plot is drawn: never at the server's start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from htam_engine import paths
from htam_lsp.suggestions import StepRecord

FOLDER = "lsp-plots"


def history_plot(uri: str, kernel: str, history: Sequence[StepRecord]) -> str | None:
    """The PNG of the kernel's history (drawn when it changed), or None before any step."""
    if not history:
        return None
    key = f"{uri}#{history[-1].n}#{len(history)}#{history[-1].claim}"
    path = paths.subdir(FOLDER) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.png"
    if not path.is_file():
        _draw(kernel, history, path)
    return str(path)


def _draw(kernel: str, history: Sequence[StepRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    estimated: list[tuple[int, float]] = []
    paired: list[tuple[int, float, float, float]] = []  # n, speedup, low, high
    for r in history:
        if not r.step.correct or r.speedup is None:
            continue
        if r.bounds is None:
            estimated.append((r.n, r.speedup))
        else:
            paired.append((r.n, r.speedup, *r.bounds))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([n for n, _ in estimated], [v for _, v in estimated], "o", label="estimate")
    if paired:
        ax.errorbar(
            [p[0] for p in paired], [p[1] for p in paired],
            yerr=[[p[1] - p[2] for p in paired], [p[3] - p[1] for p in paired]],
            fmt="D", capsize=4, label="timed in pairs (95 %)",
        )  # fmt: skip
    failed = [r.n for r in history if not r.step.correct]
    ax.plot(failed, [1.0] * len(failed), "x", color="grey", label="failed")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="step (all jobs)", ylabel="speedup over the code it started from")
    ax.set_title(f"HTAM: {kernel}")
    ax.set_xlim(0.5, max(r.n for r in history) + 0.5)  # whole steps, one step included
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
