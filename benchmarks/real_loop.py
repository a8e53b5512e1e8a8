"""The real loop on CPU: `htam optimize` with the offline provider on every task.

    .venv/bin/python benchmarks/real_loop.py [--quick] [--steps N] [--device cpu]
        [--tasks all|examples|kernelbench] [--engine DIR] [--before DIR]
        [--arms htam,flat,random,greedy] [--out FILE]

The tasks are `examples/*/<device>_naive.py` and, on the CPU, the naive C++ starts of
KernelBench level-1 problems in `tests/fixtures/kernelbench/naive_cpu/*_cpu.py`. Each runs as
`python -m htam_engine.cli optimize ... --json` in a subprocess, one after the other (timing
needs the cores), with HTAM_HOME in a fresh temporary folder shared by the whole run, so
the memory learns across the tasks the way it does for a user. The offline provider
applies mechanical rewrites only. `--engine DIR` runs another checkout's engine.

Arms, compared in one run: `--arms` names selection policies (`htam optimize
--selection`: htam, flat, random, greedy, ...) and `--before DIR` adds the arm `before`,
DIR's engine with its default policy. Each task runs under every arm in turn (so a drift
of the machine reaches every arm alike), each arm with a memory of its own that learns
across the tasks; the verdict cache and the machine's limits are shared (a verdict is
keyed by the evaluator's code, so engines never share one, while the same candidate of
the same engine is timed once). Compared against the first arm, paired by task: the best
over the start (geomean ratio with a 95 % bootstrap interval over tasks) and the
evaluations until a kept step reached 1.5x over the start.

Reported per task: the best over the start with its paired 95 % interval, over PyTorch
(timed at the same thread count), the steps that improved, the wall time; then the
confirmed wins (interval above 1), the geomeans, and the wall time per evaluation split
into compile / verify / time. --quick runs the first task for 2 steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("compile", "verify", "time")
TIMEOUT_S = 900
KERNELBENCH = ROOT / "tests" / "fixtures" / "kernelbench" / "naive_cpu"


def task_paths(device: str, which: str) -> list[Path]:
    """The starting kernels of `which` task set, examples first."""
    examples = sorted(ROOT.glob(f"examples/*/{device}_naive.py"))
    bench = sorted(KERNELBENCH.glob(f"*_{device}.py"))
    return {"examples": examples, "kernelbench": bench, "all": examples + bench}[which]


def task_name(path: Path) -> str:
    return path.parent.name if path.parent.parent.name == "examples" else path.stem


@dataclass(frozen=True)
class Arm:
    """One way of running the loop: an engine's checkout and a selection policy (None:
    the engine's default, for an engine from before `--selection`)."""

    name: str
    engine: Path = ROOT
    selection: str | None = None


SHARED = ("eval-cache", "machine", "sizes")  # HTAM home folders every arm may share


def arm_home(home: Path, arm: Arm) -> Path:
    """`arm`'s own HTAM home (its memory) whose verdict cache and machine limits are
    links to the run's shared ones."""
    own = home / f"arm-{arm.name}"
    own.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        (home / "shared" / name).mkdir(parents=True, exist_ok=True)
        if not (own / name).exists():
            (own / name).symlink_to(home / "shared" / name)
    return own


def run_example(
    path: Path,
    steps: int,
    device: str,
    seed: int,
    home: Path,
    timeout_s: float = TIMEOUT_S,
    arm: Arm = Arm("htam"),
) -> dict[str, Any]:
    """One `htam optimize` run of `arm`'s engine (`python -m` puts its folder first on the
    path); a failed run is recorded with its error, never raised."""
    name = task_name(path)
    command = [
        sys.executable, "-m", "htam_engine.cli", "optimize", str(path.resolve()),
        "--provider", "offline", "--device", device, "--steps", str(steps),
        "--seed", str(seed), "--json", "--output", str(home / f"out-{name}"),
    ]  # fmt: skip
    if arm.selection is not None:
        command += ["--selection", arm.selection]
    env = {**os.environ, "HTAM_HOME": str(home), "PYTHONPATH": str(arm.engine)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=arm.engine
        )
    except subprocess.TimeoutExpired:
        return {"example": name, "error": f"timed out after {timeout_s:.0f} s"}
    wall = time.monotonic() - started
    try:  # `htam optimize` exits 1 with its JSON when nothing correct was found
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        output = (done.stderr.strip() or done.stdout.strip())[-600:]
        return {"example": name, "error": f"exit {done.returncode}: {output}"}
    if "start_verdict" not in result:  # the CLI's error document
        return {"example": name, "error": f"exit {done.returncode}: {result.get('error')}"}
    return {
        "example": name,
        "exit_code": done.returncode,
        "wall_s": wall,
        **summarize_run(result),
    }


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    verdicts = [result["start_verdict"], *(s["verdict"] for s in result["steps"])]
    start = result["start_verdict"].get("speedup")
    return {
        "correct": result["correct"],
        "best_speedup": result["best_speedup"],
        "best_interval": result.get("best_interval"),
        "improved_steps": [s["step"] for s in result["steps"] if s["status"] == "improved"],
        "ref_speedup": result["ref_speedup"],
        "start_ref_speedup": result["start_verdict"].get("speedup"),
        "start_error": (result["start_verdict"].get("error") or {}).get("message"),
        "steps": [
            {
                "global": s["global"],
                "local": s["local"],
                "status": s["status"],
                "speedup": s["speedup"],
                "correct": bool(s["verdict"].get("correct")),
                # the candidate's ratio over the start, from their timings vs PyTorch
                "over_start": _over(s["verdict"].get("speedup"), start),
            }
            for s in result["steps"]
        ],
        "phase_seconds": [v.get("phase_seconds") or {} for v in verdicts],
        "best_source": result["best_source"],
        "stopped": result.get("stopped", ""),
        "steps_used": len(result["steps"]),
        **floor_fractions(best_verdict(result)),
    }


def best_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The verdict of the run's best (the start's where no step was kept)."""
    kept = [s["verdict"] for s in result["steps"] if s["step"] == result.get("best_step")]
    return kept[0] if kept else result["start_verdict"]


def floor_fractions(verdict: dict[str, Any]) -> dict[str, float | None]:
    """The verdict's fraction of the roofline time (the floor counting special functions),
    and of the old floor (bytes and FLOPs alone); None where it was not placed."""
    placed = verdict.get("roofline") or {}
    if "fraction" not in placed or not placed.get("roofline_ms"):
        return {"floor_fraction": None, "old_floor_fraction": None}
    old_ms = max(
        placed["bytes"] / (placed["bandwidth_gbs"] * 1e9) * 1e3,
        placed["flops"] / (placed["peak_gflops"] * 1e9) * 1e3 if placed["peak_gflops"] else 0.0,
    )
    fraction = placed["fraction"]
    return {
        "floor_fraction": fraction,
        "old_floor_fraction": fraction * old_ms / placed["roofline_ms"],
        "floor_bound": placed.get("bound"),
    }


def _over(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def evaluations_to(run: dict[str, Any], target: float) -> int | None:
    """The evaluations (the start is the first) until a kept step reached `target` over
    the start; None: not within the run."""
    for number, step in enumerate(run.get("steps", []), start=2):
        if step["status"] == "improved" and (step.get("over_start") or 0.0) >= target:
            return number
    return None


def error_line(run: dict[str, Any]) -> str:
    """The last line of a failed run's error, for a table cell."""
    lines = str(run.get("error") or "").strip().splitlines()
    return lines[-1].replace("|", "/") if lines else "failed without a message"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _geomean(values: list[float | None]) -> float | None:
    good = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in good)) if good else None


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    steps = [s for r in ok for s in r["steps"]]
    phases = [p for r in ok for p in r["phase_seconds"] if p]
    return {
        "examples": len(runs),
        "failed_runs": len(runs) - len(ok),
        "correct_examples": sum(bool(r["correct"]) for r in ok),
        "confirmed_wins": sum(confirmed(r) for r in ok),
        "candidates": len(steps),
        "correct_rate": sum(s["correct"] for s in steps) / len(steps) if steps else None,
        "geomean_over_start": _geomean([r["best_speedup"] for r in ok]),
        "geomean_over_pytorch": _geomean([r["ref_speedup"] for r in ok]),
        "geomean_start_over_pytorch": _geomean([r["start_ref_speedup"] for r in ok]),
        "geomean_floor_fraction": _geomean([r.get("floor_fraction") for r in ok]),
        "geomean_old_floor_fraction": _geomean([r.get("old_floor_fraction") for r in ok]),
        "median_phase_s": {ph: _median([p.get(ph, 0.0) for p in phases]) for ph in PHASES},
        "median_wall_per_evaluation_s": _median([r["wall_s"] / (len(r["steps"]) + 1) for r in ok]),
    }


def confirmed(run: dict[str, Any]) -> bool:
    """A win over the start whose paired interval lies above 1."""
    interval = run.get("best_interval") or (0.0, 0.0)
    return bool(run.get("improved_steps")) and interval[0] > 1.0


def _interval(run: dict[str, Any]) -> str:
    interval = run.get("best_interval")
    return f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else ""


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(out: dict[str, Any]) -> str:
    """Every arm's table, then the arms against the first one."""
    arms = out["arms"]
    tables = [arm_markdown(out, name, arm) for name, arm in arms.items()]
    tables.append(floor_markdown(out))
    if len(arms) > 1:
        tables.append(comparison_markdown(out["comparison"]))
    return "\n\n".join(tables)


def arm_markdown(out: dict[str, Any], name: str, arm: dict[str, Any]) -> str:
    a = arm["summary"]
    lines = [
        f"Real loop, arm `{name}` (engine {arm['engine']}, selection "
        f"{arm['selection'] or 'default'}): offline provider, device {out['device']}, "
        f"{out['steps']} steps per task, seed {out['seed']}.",
        "",
        "| task | correct | best vs start (95 %) | best vs PyTorch | start vs PyTorch | improved "
        "steps | wall s | steps (direction/strategy: status) | compile / verify / time s "
        "(median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in arm["runs"]:
        if "error" in r:
            lines.append(f"| {r['example']} | run failed: {error_line(r)} | | | | | | | |")
            continue
        path = "; ".join(f"{s['global']}/{s['local']}: {s['status']}" for s in r["steps"])
        path += f" (stopped: {r['stopped']})" if r.get("stopped") else ""
        if r["start_error"]:
            path = f"start failed: {r['start_error']}; {path}".replace("|", "/")
        ph = [p for p in r["phase_seconds"] if p]
        times = " / ".join(_s(_median([p.get(k, 0.0) for p in ph])) for k in PHASES)
        improved = ", ".join(map(str, r["improved_steps"])) or "none"
        lines.append(
            f"| {r['example']} | {r['correct']} | {_x(r['best_speedup'])}{_interval(r)} | "
            f"{_x(r['ref_speedup'])} | {_x(r['start_ref_speedup'])} | {improved} | "
            f"{r['wall_s']:.0f} | {path} | {times} |"
        )
    m = a["median_phase_s"]
    rate = "-" if a["correct_rate"] is None else f"{a['correct_rate']:.2f}"
    lines += [
        "",
        f"Correct candidates: {rate} of {a['candidates']}; examples with a correct "
        f"implementation: {a['correct_examples']} of {a['examples']}; failed runs: "
        f"{a['failed_runs']}; confirmed wins: {a['confirmed_wins']}. Geomeans over the "
        f"correct examples: best over start "
        f"{_x(a['geomean_over_start'])}, over PyTorch "
        f"{_x(a['geomean_over_pytorch'])} (start: {_x(a['geomean_start_over_pytorch'])}). "
        f"Per evaluation (median s): compile {_s(m['compile'])}, verify {_s(m['verify'])}, "
        f"time {_s(m['time'])}; wall {_s(a['median_wall_per_evaluation_s'])}.",
    ]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def floor_markdown(out: dict[str, Any]) -> str:
    """Per task and arm: the best's fraction of the floor (special functions counted) and
    of the old floor (bytes and FLOPs), the steps used of the run's, why it stopped."""
    arms = out["arms"]
    head = " | ".join(f"{n}: floor / old floor / steps / stopped" for n in arms)
    lines = [
        f"The best against this machine's floor ({out['steps']} steps per task).",
        "",
        f"| task | {head} |",
        "| --- |" + " --- |" * len(arms),
    ]
    runs = {name: {r["example"]: r for r in arm["runs"]} for name, arm in arms.items()}
    for task in runs[next(iter(arms))]:
        cells = []
        for name in arms:
            r = runs[name].get(task, {})
            if "error" in r or not r:
                cells.append(f"run failed: {error_line(r)}" if r else "-")
                continue
            stopped = str(r.get("stopped", "")).replace("|", "/")
            cells.append(
                f"{_pct(r.get('floor_fraction'))} ({r.get('floor_bound') or '-'}) / "
                f"{_pct(r.get('old_floor_fraction'))} / {r.get('steps_used', '-')} / {stopped}"
            )
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, arm in arms.items():
        a = arm["summary"]
        lines.append(
            f"`{name}`: geomean of the floor {_pct(a.get('geomean_floor_fraction'))}, of the "
            f"old floor {_pct(a.get('geomean_old_floor_fraction'))}."
        )
    return "\n".join(lines)


def compare_arms(arms: dict[str, dict[str, Any]], target: float = 1.5) -> dict[str, Any]:
    """Each arm against the first, paired by task (tasks where both runs succeeded)."""
    names = list(arms)
    runs = {name: {r["example"]: r for r in arms[name]["runs"]} for name in names}
    base = names[0]
    rows = []
    for task in runs[base]:
        row: dict[str, Any] = {"task": task}
        for name in names:
            run = runs[name].get(task, {})
            ok = "error" not in run and bool(run)
            row[name] = {
                "best": run.get("best_speedup") if ok else None,
                "evaluations_to_target": evaluations_to(run, target) if ok else None,
            }
        rows.append(row)
    versus = {}
    for name in names[1:]:
        pairs = [(r[name]["best"], r[base]["best"]) for r in rows]
        ratios = [a / b for a, b in pairs if a and b]
        versus[name] = {"tasks": len(ratios), **bootstrap_geomean(ratios)}
    reached = {
        name: sum(r[name]["evaluations_to_target"] is not None for r in rows) for name in names
    }
    return {"base": base, "target": target, "rows": rows, "versus_base": versus, "reached": reached}


def bootstrap_geomean(ratios: list[float], draws: int = 2000) -> dict[str, float | None]:
    """The geomean of `ratios` with a 95 % interval from resampling the tasks."""
    if not ratios:
        return {"geomean": None, "low": None, "high": None}
    rng = random.Random(0)
    logs = [math.log(r) for r in ratios]
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws))
    low, high = means[int(0.025 * draws)], means[int(0.975 * draws) - 1]
    return {
        "geomean": math.exp(statistics.fmean(logs)),
        "low": math.exp(low),
        "high": math.exp(high),
    }


def comparison_markdown(c: dict[str, Any]) -> str:
    names = [c["base"], *c["versus_base"]]
    target = f"{c['target']:g}x"
    head = " | ".join(f"{n}: best / evals to {target}" for n in names)
    lines = [
        f"Arms against `{c['base']}`, paired by task (best over the start; evaluations, the "
        f"start included, until a kept step reached {target} over the start; - : never).",
        "",
        f"| task | {head} |",
        "| --- |" + " --- |" * len(names),
    ]
    for row in c["rows"]:
        cells = [f"{_x(row[n]['best'])} / {row[n]['evaluations_to_target'] or '-'}" for n in names]
        lines.append(f"| {row['task']} | " + " | ".join(cells) + " |")
    lines.append("")
    reached = ", ".join(f"{n} {c['reached'][n]}" for n in names)
    lines.append(f"Tasks that reached {target}: {reached} (of {len(c['rows'])}).")
    for name, v in c["versus_base"].items():
        if v["geomean"] is not None:
            lines.append(
                f"`{name}` over `{c['base']}`: geomean {v['geomean']:.2f}x "
                f"(95 % {v['low']:.2f}-{v['high']:.2f}) over {v['tasks']} tasks."
            )
    return "\n".join(lines)


def parse_arms(names: str, engine: Path, before: Path | None) -> list[Arm]:
    """`--arms a,b` (selection policies of `engine`) and `--before DIR` as the last arm."""
    arms = [Arm(n.strip(), engine, n.strip()) for n in names.split(",") if n.strip()]
    if len(arms) == 1 and arms[0].name == "htam":
        arms = [Arm("htam", engine)]  # the default policy: any engine runs it
    if before is not None:
        arms.append(Arm("before", before.resolve()))
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="first example, 2 steps")
    parser.add_argument("--steps", type=int, help="steps per task (default 6; quick 2)")
    parser.add_argument("--tasks", choices=("all", "examples", "kernelbench"), default="all")
    parser.add_argument("--engine", type=Path, default=ROOT, help="checkout whose engine runs")
    parser.add_argument("--before", type=Path, help="also run this checkout's engine (arm before)")
    parser.add_argument(
        "--arms", default="htam", help="selection policies to compare (htam,flat,random,greedy)"
    )
    parser.add_argument("--only", help="comma-separated task names (the table's first column)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("real_loop.json"), help="JSON output")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    steps = args.steps or (2 if args.quick else 6)
    tasks = task_paths(args.device, args.tasks)[: 1 if args.quick else None]
    if args.only:
        tasks = [p for p in tasks if task_name(p) in args.only.split(",")]
    if not tasks:
        parser.error(f"no task matches --only {args.only}")
    arms = parse_arms(args.arms, args.engine.resolve(), args.before)
    out: dict[str, Any] = {"device": args.device, "steps": steps, "seed": args.seed}
    out["arms"] = {
        a.name: {"engine": str(a.engine), "selection": a.selection, "runs": []} for a in arms
    }
    with tempfile.TemporaryDirectory(prefix="htam-bench-") as home:
        for path in tasks:  # written after every task: a long run's partial result survives
            for arm in arms:
                run = run_example(
                    path, steps, args.device, args.seed, arm_home(Path(home), arm), arm=arm
                )
                results = out["arms"][arm.name]
                results["runs"].append(run)
                results["summary"] = aggregate(results["runs"])
            if len(arms) > 1:
                out["comparison"] = compare_arms(out["arms"])
            out["markdown"] = markdown(out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(out["markdown"])


if __name__ == "__main__":
    main()
