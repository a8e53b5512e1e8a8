"""Does one honest kernel get the same number idle and next to a busy neighbour?

    .venv/bin/python benchmarks/bench_noise.py [--baseline DIR --baseline-python PY]
        [--runs 5] [--duel OTHER.py] [--out FILE.json]

Evaluates one candidate (`htam eval --no-cache --json`) `--runs` times on an idle machine
and `--runs` times beside a neighbour that keeps one core busy (a bounded busy loop in
its own process), with this checkout and, with `--baseline DIR`, an older checkout (for
example `git worktree add ../htam-base <rev>` outside /tmp, which the sandbox hides) in
the same run, alternating. Reported per checkout and condition: the speedups, their
spread (max/min), how many loaded runs' intervals contain the idle median, and the
per-candidate overhead (the whole command's wall time less its timing phase).

With `--duel OTHER`, the candidate is also timed in pairs against OTHER as the loop's duel
against its best does (`compare`), `--runs` times idle and loaded: a duel's own spread
between runs, and whether its interval (the run-to-run term included) holds the idle
median. With `--decide M` as well, each duel is timed both ways, alternating: stopped
only by its interval's width (as before the sequential rule), and stopped as soon as the
interval lies wholly above or below M (`stats.settled`, the loop's question to a duel):
the spread, the honesty and the pairs and seconds each way.

`--simulate N` instead runs the two stopping rules (width only; width or decided at
`--decide`, default 1.02) on N synthetic timings per true speedup, in this process, as
the judge applies them (10 pairs at least, a look every 5, at most 100): each run's true
speedup drifts from the long-run one by the run-to-run spread, its pairs share a
machine state now and then 8x slower; reported per rule, the median pairs, how often the
final interval holds the long-run speedup, and how often a decision was the wrong side.

Then (unless `--skip-overhead`), in one process as the loop evaluates (this checkout
only), the overhead per candidate with every judge started cold and with one started ahead
(`standby.keep_warm`), the next candidate coming 0, 1 or 5 s after the evaluation
before, alternating: what an evaluation costs besides its timing.

The baseline runs with its own interpreter, whose path must import DIR's package first
(the sandbox passes no PYTHONPATH to workers, and this checkout's editable install would
win): a venv with a `.pth` naming DIR, then this venv's site-packages, does it:

    python3.11 -m venv --without-pip ../base-venv
    printf "$PWD/../htam-base\n$PWD/.venv/lib/python3.11/site-packages\n" \
        > ../base-venv/lib/python3.11/site-packages/aaa-base.pth
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
TASK = "examples/softmax/reference.py"
CANDIDATE = "examples/softmax/cpu_naive.py"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


Engine = tuple[str, Path]  # an interpreter and the checkout it runs in (`-m` imports from it)


def evaluate(engine: Engine, task: str, candidate: str, env: dict[str, str]) -> dict[str, Any]:
    """One `htam eval` of `candidate` by `engine`."""
    python, checkout = engine
    command = [python, "-m", "htam_engine.cli", "eval", str(ROOT / task), str(ROOT / candidate)]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "--no-cache", "--json"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall_s = time.perf_counter() - start
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"error": (done.stderr or done.stdout)[-400:], "wall_s": wall_s}
    interval = verdict.get("interval") or {}
    phases = verdict.get("phase_seconds") or {}
    return {
        "speedup": verdict.get("speedup"),
        "low": interval.get("low"),
        "high": interval.get("high"),
        "pairs": interval.get("pairs"),
        "converged": verdict.get("converged"),
        "noisy": verdict.get("noisy"),
        "stolen_share": (verdict.get("spread") or {}).get("stolen_share"),
        "wall_s": wall_s,
        "overhead_s": wall_s - float(phases.get("time", 0.0)),
        "error": (verdict.get("error") or {}).get("message"),
    }


def loaded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One `measure` beside a neighbour burning a core for as long as it runs."""
    neighbour = multiprocessing.Process(target=_spin, args=(600.0,), daemon=True)
    neighbour.start()
    time.sleep(0.5)
    try:
        return measure()
    finally:
        neighbour.terminate()
        neighbour.join(5)


def duel(candidate: str, incumbent: str, decide: float | None = None) -> dict[str, Any]:
    """One duel as the loop times it (`compare`, in this process): `candidate` in pairs
    against `incumbent`, each verified against the candidate's reference; with `decide`,
    timing stops once the interval lies wholly on one side of it."""
    from htam_engine.evaluate.runner import compare
    from htam_engine.task import load_task

    source, other = (ROOT / candidate).read_text(), (ROOT / incumbent).read_text()
    task = load_task(ROOT / candidate)
    verdict = compare(task, source, other, device="cpu", use_cache=False, decide=decide)
    interval = verdict.interval
    return {
        "speedup": verdict.speedup,
        "low": interval.low if interval else None,
        "high": interval.high if interval else None,
        "pairs": interval.pairs if interval else None,
        "within_run_half_width": verdict.within_run_half_width,
        "time_s": verdict.phase_seconds.get("time"),
        "converged": verdict.converged,
        "error": verdict.error.message if verdict.error else None,
    }


def summarise(idle: list[dict[str, Any]], busy: list[dict[str, Any]]) -> dict[str, Any]:
    def speedups(runs: list[dict[str, Any]]) -> list[float]:
        return [r["speedup"] for r in runs if r.get("speedup")]

    idle_s, busy_s = speedups(idle), speedups(busy)
    overheads = [r["overhead_s"] for r in idle + busy if "overhead_s" in r]  # none for duels
    idle_median = statistics.median(idle_s) if idle_s else None
    honest = sum(
        1
        for r in busy
        if idle_median is not None and r.get("low") and r["low"] <= idle_median <= r["high"]
    )
    return {
        "idle": idle_s,
        "loaded": busy_s,
        "idle_median": idle_median,
        "idle_spread": max(idle_s) / min(idle_s) if idle_s else None,
        "loaded_spread": max(busy_s) / min(busy_s) if busy_s else None,
        "all_spread": max(idle_s + busy_s) / min(idle_s + busy_s) if idle_s and busy_s else None,
        "loaded_interval_holds_idle_median": f"{honest}/{len(busy)}",
        "overhead_s": statistics.median(overheads) if overheads else None,
        "errors": [r["error"] for r in idle + busy if r.get("error")],
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    def fmt(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    def overhead(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds:.1f} s"

    lines = [
        "| checkout | idle speedups | loaded speedups | spread idle | spread loaded "
        "| spread all | loaded interval holds idle median | overhead per candidate |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in results.items():
        lines.append(
            f"| {name} | {fmt(s['idle'])} | {fmt(s['loaded'])} | {s['idle_spread'] or 0:.2f}x "
            f"| {s['loaded_spread'] or 0:.2f}x | {s['all_spread'] or 0:.2f}x "
            f"| {s['loaded_interval_holds_idle_median']} | {overhead(s['overhead_s'])} |"
        )
    return "\n".join(lines)


OVERHEAD_MODES = (  # (name, a judge started ahead, seconds until the next candidate)
    ("cold", False, 1.0),
    ("ahead, next candidate at once", True, 0.0),
    ("ahead, next candidate after 1 s", True, 1.0),
    ("ahead, next candidate after 5 s", True, 5.0),
)


def overhead_in_process(candidate: str, runs: int) -> dict[str, float]:
    """Median seconds per evaluation besides timing, with every judge started cold and
    with one started ahead, the next candidate coming at once (a mechanical rewrite),
    after 1 s, or after 5 s (an LLM's answer), alternating."""
    from htam_engine.evaluate import evaluate, standby
    from htam_engine.task import load_task

    loaded_task = load_task(ROOT / candidate)
    source = (ROOT / candidate).read_text()
    seen: dict[str, list[float]] = {mode: [] for mode, _, _ in OVERHEAD_MODES}
    for _ in range(runs):
        for mode, warm, pause_s in OVERHEAD_MODES:
            standby.keep_warm(warm)
            evaluate(loaded_task, source, device="cpu", use_cache=False)  # fills the spare
            time.sleep(pause_s)
            start = time.perf_counter()
            verdict = evaluate(loaded_task, source, device="cpu", use_cache=False)
            wall = time.perf_counter() - start
            seen[mode].append(wall - verdict.phase_seconds.get("time", 0.0))
            standby.keep_warm(False)
            time.sleep(1.0)
    return {mode: statistics.median(values) for mode, values in seen.items()}


def duel_runs(
    candidate: str, incumbent: str, runs: int, decide: float | None = None
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """`runs` duels idle and `runs` loaded, alternating: a duel's own spread between
    runs, and whether its interval holds the next run's (the idle median); with
    `decide`, each also stopped at that question, alternating with the plain ones."""
    ways = {"duel": None} if decide is None else {"duel": None, f"duel decided at {decide}": decide}
    seen = {name: {"idle": [], "loaded": []} for name in ways}  # type: ignore[var-annotated]
    for _ in range(runs):
        for name, question in ways.items():
            measure = functools.partial(duel, candidate, incumbent, question)
            seen[name]["idle"].append(measure())
            seen[name]["loaded"].append(loaded(measure))
    return seen


def cost(runs: list[dict[str, Any]]) -> str:
    """Median pairs and timing seconds of duels."""
    pairs = [r["pairs"] for r in runs if r.get("pairs")]
    seconds = [r["time_s"] for r in runs if r.get("time_s")]
    if not pairs or not seconds:
        return "no timing"
    return f"median {statistics.median(pairs):.0f} pairs, {statistics.median(seconds):.1f} s"


SIMULATED = (1.0, 1.03, 1.1, 2.0)  # long-run speedups, around and away from the margin
PAIR_MS = 100.0  # dear pairs, which all on one side decide at 10 (`stats.unanimous`)


def simulate(reps: int, margin: float, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Both stopping rules on the same synthetic runs (see the docstring)."""
    import math
    import random

    from htam_engine import stats
    from htam_engine.evaluate.runner import RUN_TO_RUN_CV, TARGET_HALF_WIDTH

    cv, target = RUN_TO_RUN_CV["cpu"], TARGET_HALF_WIDTH["cpu"]
    rng = random.Random(seed)
    out: dict[str, dict[str, Any]] = {}
    for true in SIMULATED:
        seen: dict[str, dict[str, list[float]]] = {
            rule: {"pairs": [], "holds": [], "wrong": []} for rule in ("width", "decided")
        }
        for _ in range(reps):
            run_speedup = true * rng.lognormvariate(0, math.log1p(cv))
            ref, cand = [], []
            for _ in range(100):
                load = rng.choice([1.0, 1.0, 1.0, 8.0])
                ref.append(PAIR_MS * load * rng.lognormvariate(0, 0.15))
                cand.append(PAIR_MS / run_speedup * load * rng.lognormvariate(0, 0.15))
            for rule, threshold in (("width", None), ("decided", margin)):
                n = 10
                while n < 100:
                    if stats.job_settled(ref[:n], cand[:n], target, threshold, cv):
                        break
                    n += 5
                final = stats.paired_speedup(ref[:n], cand[:n]).with_run_to_run(cv)
                seen[rule]["pairs"].append(n)
                seen[rule]["holds"].append(float(final.low <= true <= final.high))
                decided = stats.side(final, margin)
                wrong = decided != 0 and (decided > 0) != (true >= margin)
                seen[rule]["wrong"].append(float(wrong))
        out[f"{true:g}x"] = {
            rule: {
                "median_pairs": statistics.median(v["pairs"]),
                "interval_holds": statistics.fmean(v["holds"]),
                "wrong_side": statistics.fmean(v["wrong"]),
            }
            for rule, v in seen.items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare against")
    parser.add_argument("--baseline-python", help="an interpreter that imports --baseline's code")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--candidate", default=CANDIDATE)
    parser.add_argument("--duel", help="also time --candidate in pairs against this one")
    parser.add_argument("--decide", type=float, help="duels also stopped at this question")
    parser.add_argument("--skip-overhead", action="store_true", help="no in-process overhead")
    parser.add_argument("--simulate", type=int, help="only simulate the stopping rules, N runs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.simulate:
        simulated = simulate(args.simulate, args.decide or 1.02)
        print("| long-run speedup | rule | median pairs | interval holds it | wrong side |")
        print("| --- | --- | ---: | ---: | ---: |")
        for true, rules in simulated.items():
            for rule, v in rules.items():
                print(f"| {true} | {rule} | {v['median_pairs']:.0f} | {v['interval_holds']:.2f} "
                      f"| {v['wrong_side']:.2f} |")  # fmt: skip
        if args.out:
            args.out.write_text(json.dumps(simulated, indent=1))
        return
    checkouts: dict[str, Engine] = {"this checkout": (sys.executable, ROOT)}
    if args.baseline:
        if not args.baseline_python:
            parser.error("--baseline needs --baseline-python (see the docstring)")
        baseline = (args.baseline_python, args.baseline.resolve())
        checkouts = {f"baseline ({args.baseline.name})": baseline, **checkouts}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HTAM_HOME"] = tempfile.mkdtemp(prefix="htam-bench-noise-")  # not the user's data
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"idle": [], "loaded": []} for name in checkouts
    }
    for _ in range(args.runs):  # alternate checkouts and conditions: drift hits all alike
        for name, checkout in checkouts.items():
            runs[name]["idle"].append(evaluate(checkout, args.task, args.candidate, env))
            measure = functools.partial(evaluate, checkout, args.task, args.candidate, env)
            runs[name]["loaded"].append(loaded(measure))
    keeper.stop(Path(env["HTAM_HOME"]))  # the judge a one-shot left kept
    results = {name: summarise(r["idle"], r["loaded"]) for name, r in runs.items()}
    print(table(results))
    os.environ["HTAM_HOME"] = env["HTAM_HOME"]
    duels = duel_runs(args.candidate, args.duel, args.runs, args.decide) if args.duel else {}
    for way, seen in duels.items():
        name = f"{way} against {args.duel}"
        results[name] = summarise(seen["idle"], seen["loaded"])
        print(table({name: results[name]}))
        print(f"cost: {cost(seen['idle'])} idle, {cost(seen['loaded'])} loaded")
    overhead: dict[str, float] = {}
    if not args.skip_overhead:
        overhead = overhead_in_process(args.candidate, args.runs)  # its task: its own binding
        print(
            "\noverhead per candidate in one process (besides timing): "
            + ", ".join(f"{mode} {seconds:.2f} s" for mode, seconds in overhead.items())
        )
    if args.out:
        data = {"task": args.task, "candidate": args.candidate, "cores": os.cpu_count()}
        data.update(results=results, runs=runs, overhead_in_process=overhead, duels=duels)
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
