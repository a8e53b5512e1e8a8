"""Does the judge hold on a busy machine? Honest kernels and cheats, in a loop, beside
neighbours that keep the cores busy.

    .venv/bin/python benchmarks/red_team.py [--rounds 2] [--spinners 2] [--only NAME ...]
        [--out FILE.json]

Each round evaluates every honest candidate (`tests/fixtures/candidates/honest/`) and every
cheat (`tests/fixtures/candidates/adversarial/`) through the trusted side only
(`run_candidate`: past the static checks, as a cheat that evades them would), while
`--spinners` processes spin (a 2-core machine at load 4 or more). Reported:

- honest: how often one was called `cheating` (or failed at all), `suspect`, or placed
  below the machine's floor (`faster_than_light`), and how often its timing was disturbed;
- cheats: how often each was caught: rejected (not correct), suspect, or neutralized (a
  correct verdict not clearly faster than its honest twin, `plain`, that round: the low
  end of its interval at or below the high end of the twin's: it gained nothing).
Targets: 0 honest `cheating`, `suspect` or below the floor; every cheat caught every round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from htam_engine.evaluate import Limits
from htam_engine.evaluate.runner import run_candidate
from htam_engine.evaluate.sandbox import sandbox_mode
from htam_engine.evaluate.verdict import Verdict
from htam_engine.placement import Placement
from htam_engine.task import load_task

CANDIDATES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "candidates"
LIMITS = Limits(compile_s=120, verify_s=60, time_s=60)
ALLOWED = {"rare_helper": ("softmax", "_softmax")}  # what the tests allow each
TWIN = "plain"  # the honest softmax every cheat is a variant of


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
    """`count` busy-loop processes for the block's duration."""
    spinners = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def judged(path: Path) -> dict[str, Any]:
    task = replace(load_task(path), allow_torch=ALLOWED.get(path.stem, ()))
    verdict = Verdict(device="cpu", sandbox=sandbox_mode())
    started = time.monotonic()
    run_candidate(task, path.read_text(), verdict, LIMITS, threading.Event(), lambda _p: None)
    light = verdict.roofline
    return {
        "name": path.stem,
        "correct": verdict.correct,
        "error": verdict.error.kind.value if verdict.error else None,
        "why": verdict.error.message[:200] if verdict.error else "",
        "speedup": verdict.speedup,
        "low": verdict.interval.low if verdict.interval else None,
        "high": verdict.interval.high if verdict.interval else None,
        "suspect": verdict.suspect,
        "below_floor": isinstance(light, Placement) and light.faster_than_light,
        "noisy": verdict.noisy,
        "disturbed_share": verdict.spread.get("disturbed_share", 0.0),
        "load": os.getloadavg()[0],
        "seconds": round(time.monotonic() - started, 1),
    }


def one_round(only: list[str]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in ("honest", "adversarial"):
        paths = sorted((CANDIDATES / kind).glob("*.py"))
        found[kind] = [judged(p) for p in paths if not only or p.stem in only]
        for row in found[kind]:
            print(kind, json.dumps(row), flush=True)
    return found


def caught(row: dict[str, Any], twin_high: float | None) -> str:
    """How a cheat was caught ('' where it was not, or the judge itself failed)."""
    if row["error"] == "evaluator_error":
        return ""
    if not row["correct"]:
        return f"rejected ({row['error']})"
    if row["suspect"]:
        return "suspect"
    if twin_high is not None and (row["low"] or 0.0) <= twin_high:  # not clearly faster
        return "neutralized"
    return ""


def summary(rounds: list[dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    honest = [row for r in rounds for row in r["honest"]]
    missed = []
    for found in rounds:
        twin = next((row for row in found["honest"] if row["name"] == TWIN), None)
        for row in found["adversarial"]:
            if not caught(row, twin["high"] if twin else None):
                missed.append(row)
    return {
        "honest_runs": len(honest),
        "honest_cheating": sum(row["error"] == "cheating" for row in honest),
        "honest_failed": sum(not row["correct"] for row in honest),
        "evaluator_errors": sum(
            row["error"] == "evaluator_error" for r in rounds for k in r.values() for row in k
        ),
        "honest_suspect": sum(row["suspect"] for row in honest),
        "honest_below_floor": sum(row["below_floor"] for row in honest),
        "honest_disturbed": sum(row["disturbed_share"] > 0 for row in honest),
        "cheat_runs": sum(len(r["adversarial"]) for r in rounds),
        "cheats_missed": [f"{row['name']} {row['speedup']}" for row in missed],
        "load_median": statistics.median(row["load"] for row in honest) if honest else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with spinning(args.spinners):
        rounds = [one_round(args.only) for _ in range(args.rounds)]
    result = {"sandbox": sandbox_mode(), "summary": summary(rounds), "rounds": rounds}
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
