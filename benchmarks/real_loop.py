"""The real loop on CPU: `htam optimize` with the offline provider on every task.

    .venv/bin/python benchmarks/real_loop.py [--quick] [--steps N] [--device cpu]
        [--tasks all|examples|kernelbench] [--engine DIR] [--out FILE]

The tasks are `examples/*/<device>_naive.py` and, on the CPU, the naive C++ starts of
KernelBench level-1 problems in `tests/fixtures/kernelbench/naive_cpu/*_cpu.py`. Each runs as
`python -m htam_engine.cli optimize ... --json` in a subprocess, one after the other (timing
needs the cores), with HTAM_HOME in a fresh temporary folder shared by the whole run, so
the memory learns across the tasks the way it does for a user. The offline provider
applies mechanical rewrites only. `--engine DIR` runs another checkout's engine (for
example the main branch, as the "before") on the same tasks.

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
import statistics
import subprocess
import sys
import tempfile
import time
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


def run_example(
    path: Path,
    steps: int,
    device: str,
    seed: int,
    home: Path,
    timeout_s: float = TIMEOUT_S,
    engine: Path = ROOT,
) -> dict[str, Any]:
    """One `htam optimize` run of `engine`'s code (`python -m` puts its folder first on the
    path); a failed run is recorded with its error, never raised."""
    name = task_name(path)
    command = [
        sys.executable, "-m", "htam_engine.cli", "optimize", str(path.resolve()),
        "--provider", "offline", "--device", device, "--steps", str(steps),
        "--seed", str(seed), "--json", "--output", str(home / f"out-{name}"),
    ]  # fmt: skip
    env = {**os.environ, "HTAM_HOME": str(home), "PYTHONPATH": str(engine)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=engine
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
            }
            for s in result["steps"]
        ],
        "phase_seconds": [v.get("phase_seconds") or {} for v in verdicts],
        "best_source": result["best_source"],
    }


def error_line(run: dict[str, Any]) -> str:
    """The last line of a failed run's error, for a table cell."""
    lines = str(run.get("error") or "").strip().splitlines()
    return lines[-1].replace("|", "/") if lines else "failed without a message"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _geomean(values: list[float]) -> float | None:
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
    a = out["summary"]
    lines = [
        f"Real loop: offline provider, device {out['device']}, {out['steps']} steps per task, "
        f"seed {out['seed']}, engine {out.get('engine', ROOT)}.",
        "",
        "| task | correct | best vs start (95 %) | best vs PyTorch | start vs PyTorch | improved "
        "steps | wall s | steps (direction/strategy: status) | compile / verify / time s "
        "(median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in out["runs"]:
        if "error" in r:
            lines.append(f"| {r['example']} | run failed: {error_line(r)} | | | | | | | |")
            continue
        path = "; ".join(f"{s['global']}/{s['local']}: {s['status']}" for s in r["steps"])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="first example, 2 steps")
    parser.add_argument("--steps", type=int, help="steps per task (default 6; quick 2)")
    parser.add_argument("--tasks", choices=("all", "examples", "kernelbench"), default="all")
    parser.add_argument("--engine", type=Path, default=ROOT, help="checkout whose engine runs")
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
    engine = args.engine.resolve()
    out: dict[str, Any] = {"device": args.device, "steps": steps, "seed": args.seed}
    out |= {"engine": str(engine), "runs": []}
    with tempfile.TemporaryDirectory(prefix="htam-bench-") as home:
        for path in tasks:  # written after every task: a long run's partial result survives
            out["runs"].append(
                run_example(path, steps, args.device, args.seed, Path(home), engine=engine)
            )
            out["summary"] = aggregate(out["runs"])
            out["markdown"] = markdown(out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(out["markdown"])


if __name__ == "__main__":
    main()
