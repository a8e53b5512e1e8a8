"""Where a step's time goes: the offline loop on the CPU examples, phase by phase.

    .venv/bin/python benchmarks/bench_step.py [--baseline DIR] [--steps 2]
        [--examples softmax,gelu,...] [--conditions idle,loaded] [--out FILE.json]
        [--evals N] [--watched N]

Runs `htam optimize EXAMPLE/cpu_naive.py --provider offline --events` (mechanical
rewrites only: no model in the way) for each CPU example, idle and beside a neighbour
that keeps one core busy (a spinning process), with this checkout and, with `--baseline
DIR`, another checkout (e.g. the main one) in the same run, alternating, each run in a
fresh HTAM_HOME (nothing cached from another run). The phases are read off the events'
arrival times, so any checkout that writes phase events is measured the same way:
seconds per phase (a phase lasts until the next event), per step (its first phase to
its step event), the start (step 0) and the closing duel (after the last step), and the
time from the command's start to its first event. Printed as Markdown tables: medians
over the examples, per checkout and condition, and the ratio after/before. With `--evals
N`, instead: N one-shot `htam eval`s per example of a candidate never built before, in a
home whose machine limits are measured (wall time and the verdict's phases), each 5 s
after the last, as after an edit (a checkout that keeps a judge between commands has
started it by then). With
`--watched N`, instead: per example, N saves of a candidate never built before into a file
that `htam eval --watch` watches (from the save to its verdict), alternating with N one-shot
`htam eval`s of the same kind (this checkout only: `--watch` is new).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from htam_engine.evaluate import keeper

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("softmax", "gelu", "linear_relu", "matmul")
WATCH_EDIT_S = 5.0  # between a verdict and the next save under --watch, or one-shot
PHASES = ("select", "generate", "compile", "verify", "time", "confirm", "update")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _env(checkout: Path, home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(checkout)
    env["HTAM_HOME"] = home  # never the user's data
    return env


def run_loop(checkout: Path, example: str, steps: int) -> dict[str, Any]:
    """One offline run of `checkout`'s engine on `example`: every event with the second
    it arrived (from the command's start)."""
    env = _env(checkout, tempfile.mkdtemp(prefix="htam-bench-step-"))
    task = ROOT / "examples" / example / "cpu_naive.py"
    command = [sys.executable, "-m", "htam_engine.cli", "optimize", str(task), "--events"]
    command += ["--provider", "offline", "--device", "cpu", "--steps", str(steps)]
    command += ["--output", str(Path(env["HTAM_HOME"]) / "out")]
    start = time.monotonic()
    seen: list[tuple[float, dict[str, Any]]] = []
    log = Path(env["HTAM_HOME"]) / "stderr.log"
    with (
        log.open("w") as stderr,
        subprocess.Popen(
            command, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=stderr
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            arrived = time.monotonic() - start
            try:
                seen.append((arrived, json.loads(line)))
            except json.JSONDecodeError:
                continue
    wall_s = time.monotonic() - start
    error = log.read_text()[-600:] if process.returncode else ""
    return {"wall_s": wall_s, "events": seen, "rc": process.returncode, "error": error}


def run_eval(checkout: Path, example: str, home: str, run: int) -> dict[str, Any]:
    """One `htam eval` of a candidate never built before (the example's start with a
    comment of its own: no build to reuse, no cached verdict) in `home`, where the
    machine's limits are already measured: its wall time and the verdict's phases."""
    folder = ROOT / "examples" / example
    candidate = Path(home) / f"{example}_{run}.py"
    candidate.write_text((folder / "cpu_naive.py").read_text() + f"\n# one-shot run {run}\n")
    command = [sys.executable, "-m", "htam_engine.cli", "eval", str(folder / "reference.py")]
    command += [str(candidate), "--device", "cpu", "--json", "--no-cache"]
    start = time.monotonic()
    done = subprocess.run(command, cwd=checkout, env=_env(checkout, home), capture_output=True)
    wall_s = time.monotonic() - start
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        verdict = {"error": done.stderr.decode()[-600:]}
    phases = verdict.get("phase_seconds", {})
    return {"example": example, "wall_s": wall_s, **phases, "error": verdict.get("error")}


def evals(checkouts: dict[str, Path], examples: list[str], count: int, condition: str) -> None:
    """`count` one-shot evaluations per example and checkout, alternating; printed as the
    medians of wall time and phases, for a problem's first evaluation in the home (its
    size estimate runs, its work is counted) and for a problem seen before."""
    homes = {name: tempfile.mkdtemp(prefix="htam-bench-eval-") for name in checkouts}
    for name, checkout in checkouts.items():  # the machine's limits, measured once
        run_eval(checkout, examples[0], homes[name], -1)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    for run in range(count):
        for example in examples:
            for name, checkout in checkouts.items():
                time.sleep(WATCH_EDIT_S)  # as after an edit: a kept judge has started
                measure = functools.partial(run_eval, checkout, example, homes[name], run)
                row = loaded(measure) if condition == "loaded" else measure()
                row["first"] = run == 0 and example != examples[0]
                rows[name].append(row)
                print(f"eval, {name}, {condition}: {json.dumps(row)}", file=sys.stderr)
    for home in homes.values():
        keeper.stop(Path(home))  # the judge a one-shot left kept
    print(f"\none-shot `htam eval`, {condition}, medians of {count} x {len(examples)}:")
    print(eval_table(rows))


def watched(examples: list[str], count: int) -> None:
    """Per example, `count` saves into a file `htam eval --watch` watches, each timed from
    the save to its verdict, alternating with `count` one-shot evaluations; each one-shot
    starts WATCH_EDIT_S after the last verdict (the watch's next judge has started, as
    after an edit), and the next save follows it."""
    home = tempfile.mkdtemp(prefix="htam-bench-watch-")
    run_eval(ROOT, examples[0], home, -1)  # the machine's limits, measured once
    rows = [row for example in examples for row in _watch_example(example, home, count)]
    print(f"\n`htam eval --watch`, idle, medians of {count} x {len(examples)}:")
    print(watch_table(rows))


def watch_table(rows: list[dict[str, Any]]) -> str:
    """Medians per example, then over all, of one-shot walls and of saves to verdicts."""
    lines = ["| evals | one-shot wall_s | after a save, watched (s) |", "| --- | ---: | ---: |"]
    for example in [*dict.fromkeys(r["example"] for r in rows), None]:
        group = [r for r in rows if example in (None, r["example"])]
        one, after = (statistics.median(r[k] for r in group) for k in ("one_shot_s", "saved_s"))
        lines.append(f"| {example or 'all'} ({len(group)}) | {one:.2f} | {after:.2f} |")
    return "\n".join(lines)


def _watch_example(example: str, home: str, count: int) -> list[dict[str, Any]]:
    folder = ROOT / "examples" / example
    naive = (folder / "cpu_naive.py").read_text()
    watched = Path(home) / f"{example}_watched.py"
    watched.write_text(naive)
    command = [sys.executable, "-m", "htam_engine.cli", "eval", str(folder / "reference.py")]
    command += [str(watched), "--device", "cpu", "--watch", "--no-cache"]
    watch = subprocess.Popen(
        command, cwd=ROOT, env=_env(ROOT, home), stderr=subprocess.PIPE, text=True
    )
    assert watch.stderr is not None
    rows = []
    try:
        _next_verdict(watch.stderr)
        for run in range(count):
            time.sleep(WATCH_EDIT_S)  # the watch's next judge starts: not beside the one-shot
            one_shot = run_eval(ROOT, example, home, run)["wall_s"]
            start = time.monotonic()
            watched.write_text(naive + f"\n# watched save {run}\n")
            verdict = _next_verdict(watch.stderr)
            saved = time.monotonic() - start
            rows.append({"example": example, "one_shot_s": one_shot, "saved_s": saved})
            print(f"watched: {json.dumps({**rows[-1], 'verdict': verdict})}", file=sys.stderr)
    finally:
        watch.kill()
        watch.wait()
    return rows


def _next_verdict(lines: Any) -> str:
    """The verdict line of the next evaluation, once the watch waits again."""
    verdict = ""
    for line in lines:
        if line.startswith("htam: watching"):
            return verdict
        verdict = verdict or line.strip()
    raise RuntimeError(f"htam eval --watch ended: {verdict}")


def eval_table(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Medians per checkout of the evaluations seen before, then of the first ones."""
    columns = ("wall_s", "besides_time", "compile", "verify", "time")
    lines = ["| checkout | evals | " + " | ".join(columns) + " |"]
    lines.append("| --- | --- |" + " ---: |" * len(columns))
    for first, which in ((False, "seen before"), (True, "first of a problem")):
        for name, found in rows.items():
            group = [
                {"besides_time": r["wall_s"] - r.get("time", 0.0), **r}
                for r in found
                if r.get("first", False) == first
            ]
            if not group:
                continue
            medians = (statistics.median(r.get(c, 0.0) for r in group) for c in columns)
            cells = " | ".join(f"{value:.2f}" for value in medians)
            lines.append(f"| {name} | {which} ({len(group)}) | {cells} |")
    return "\n".join(lines)


def breakdown(run: dict[str, Any]) -> dict[str, Any]:
    """Seconds per phase, per step and for the start and the closing duel, and the
    first event's delay, from one run's events."""
    events = run["events"]
    phases: dict[str, float] = {}
    steps: list[float] = []
    start_s = closing_s = 0.0
    step_began: float | None = None
    last_step_at: float | None = None
    for index, (at, event) in enumerate(events):
        following = events[index + 1][0] if index + 1 < len(events) else run["wall_s"]
        if event["event"] == "phase":
            phases[event["phase"]] = phases.get(event["phase"], 0.0) + following - at
            if event["step"] >= 1 and step_began is None:
                step_began = at
                if last_step_at is None:  # the start: from the first event to step 1
                    start_s = at - events[0][0]
        elif event["event"] == "step" and step_began is not None:
            steps.append(at - step_began)
            step_began, last_step_at = None, at
        elif event["event"] == "result" and last_step_at is not None:
            closing_s = at - last_step_at
    statuses = [e["status"] for _, e in events if e["event"] == "step"]
    return {
        "first_event_s": events[0][0] if events else None,
        "wall_s": run["wall_s"],
        "start_s": start_s,
        "steps_s": steps,
        "closing_s": closing_s,
        "phases_s": phases,
        "statuses": statuses,
        "rc": run["rc"],
        "error": run["error"],
    }


def loaded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    neighbour = multiprocessing.Process(target=_spin, args=(1800.0,), daemon=True)
    neighbour.start()
    time.sleep(0.5)
    try:
        return measure()
    finally:
        neighbour.terminate()
        neighbour.join(5)


def summary(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the examples' runs: per step, first event, start, closing, per phase."""

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    out = {
        "step_s": median([s for r in rows for s in r["steps_s"]]),
        "first_event_s": median([r["first_event_s"] for r in rows if r["first_event_s"]]),
        "start_s": median([r["start_s"] for r in rows]),
        "closing_s": median([r["closing_s"] for r in rows]),
        "wall_s": median([r["wall_s"] for r in rows]),
    }
    for phase in PHASES:
        out[phase] = median([r["phases_s"].get(phase, 0.0) for r in rows])
    return out


def table(results: dict[str, dict[str, float | None]]) -> str:
    columns = ["step_s", "first_event_s", "start_s", "closing_s", "wall_s", *PHASES]
    lines = ["| checkout, condition | " + " | ".join(columns) + " |"]
    lines.append("| --- |" + " ---: |" * len(columns))
    for name, values in results.items():
        cells = ["-" if values[c] is None else f"{values[c]:.2f}" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout (a before)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--conditions", default="idle,loaded")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--evals", type=int, default=0, help="one-shot evals per example")
    parser.add_argument("--watched", type=int, default=0, help="saves under --watch per example")
    args = parser.parse_args()
    if args.watched:
        watched(args.examples.split(","), args.watched)
        return
    checkouts = {"this checkout": ROOT}
    if args.baseline:
        checkouts = {f"baseline ({args.baseline.name})": args.baseline.resolve(), **checkouts}
    conditions = args.conditions.split(",")
    if args.evals:
        for condition in conditions:
            evals(checkouts, args.examples.split(","), args.evals, condition)
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    for example in args.examples.split(","):  # alternate: drift hits every checkout alike
        for condition in conditions:
            for name, checkout in checkouts.items():
                measure = lambda c=checkout, e=example: run_loop(c, e, args.steps)  # noqa: E731
                run = loaded(measure) if condition == "loaded" else measure()
                row = {"example": example, **breakdown(run)}
                runs.setdefault(f"{name}, {condition}", []).append(row)
                print(f"{name}, {condition}, {example}: {json.dumps(row)}", file=sys.stderr)
    results = {name: summary(rows) for name, rows in runs.items()}
    print(f"load before/after: {os.getloadavg()}")
    print(table(results))
    if args.baseline:
        print("\nratio this checkout / baseline (median step, first event, wall):")
        for condition in conditions:
            new, old = (
                results[f"this checkout, {condition}"],
                next(v for k, v in results.items() if k.startswith("baseline") and condition in k),
            )
            ratios = [
                f"{key} {new[key] / old[key]:.2f}"
                for key in ("step_s", "first_event_s", "wall_s")
                if new[key] and old[key]
            ]
            print(f"- {condition}: " + ", ".join(ratios))
    if args.out:
        args.out.write_text(json.dumps({"results": results, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
