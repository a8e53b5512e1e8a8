"""GPU section (issue #17): the CUDA path measured on hardware, in one bounded run.

    python benchmarks/gpu_examples.py [--wheels DIR] [--quick] [--steps 3] [--budget-s 450]
                                      [--out benchmarks/results/gpu_examples.json]

Run from the repository root with the interpreter that has a CUDA build of torch (on a
bare GPU machine: its `python3`; the CPU venv of a laptop does not work there). In order:

1. Without an NVIDIA GPU (no `nvidia-smi` GPU, no /proc/driver/nvidia/gpus) it writes a
   JSON saying why it skipped and exits 0.
2. It checks that this interpreter imports what the run uses (the engine's modules and
   their workers, and pytest), and names every `pyproject.toml` dependency it lacks but
   the language server's. With
   `--wheels DIR` it first installs the wheels in DIR into this interpreter (`pip
   --no-index --no-deps`, nothing fetched) and puts the repository on its path with a
   `.pth` file, so the sandboxed workers import it too. What is still missing is written
   as `blocked`, with the `pip download` command that fetches it, and the exit code is 1.
3. `pytest -m gpu` (this script's own test left out), within a share of the budget.
4. Each `examples/*/cuda_naive.py`: `htam optimize --provider offline --device cuda`,
   then the best implementation evaluated 5 more times with `htam eval --no-cache` in
   fresh workers. Reported per example: correct, speedup over the start and over
   PyTorch (geometric mean of the re-evaluations with a 95 % interval), the runtime CV
   over the re-evaluations, and the sandbox mode of the verdicts.

Every subprocess gets only the time left of --budget-s (default 7.5 minutes), so the
whole run stays within 8 minutes; what no longer fits is listed as skipped. The JSON
(device name, driver, CUDA and nvcc versions) goes to --out and its Markdown table beside
it (.md). Commands are recorded relative to the repository (`python` for this
interpreter, `$HTAM_HOME` for the run's temporary home), never as absolute paths.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 5
EVAL_TIMEOUT_S = 120
MIN_CALL_S = 30  # start no subprocess with less time than this left
REPEAT_RESERVE_S = 45  # kept for an example's re-evaluations
TESTS_SHARE = 0.3  # of the budget, at most, for `pytest -m gpu`
SERVER_ONLY = frozenset({"pygls", "lsprotocol"})  # the language server's, not the engine's
EXTRA_NEEDS = ("pytest",)
# what `htam optimize`, `htam eval`, their workers and the test suite's conftest import
RUN_MODULES = (
    "htam_engine.loop_cli",
    "htam_engine.loop",
    "htam_engine.llm.factory",
    "htam_engine.evaluate.runner",
    "htam_engine.evaluate.worker",
    "htam_engine.evaluate.judge",
    "kernelguard",  # imported by the static checks only when they run
    "platformdirs",
    "pytest",
)
_SMOKE = """
import importlib, json, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing.append(error.name or name)
print(json.dumps(sorted(set(missing))))
"""
CONFIDENCE = 0.95
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


# --- what the machine has ------------------------------------------------------------------


def _output(command: list[str]) -> str:
    """A tool's stdout, or "" when it is absent or fails."""
    if shutil.which(command[0]) is None:
        return ""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def probe_gpu() -> dict[str, Any]:
    """The NVIDIA GPU as the driver reports it (no torch needed); "reason" when none."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    first = _output(query).splitlines()[:1]
    name, _, driver = first[0].partition(",") if first else ("", "", "")
    gpus = Path("/proc/driver/nvidia/gpus")
    listed = gpus.is_dir() and any(gpus.iterdir())
    nvcc = re.findall(r"release [\d.]+", _output(["nvcc", "--version"]))
    found: dict[str, Any] = {
        "gpu": name.strip() or None,
        "driver": driver.strip() or None,
        "nvcc": nvcc[0] if nvcc else None,
    }
    if not found["gpu"] and not listed:
        smi = "no GPU listed" if shutil.which("nvidia-smi") else "not found"
        found["reason"] = f"no NVIDIA GPU on this machine (nvidia-smi: {smi}; {gpus}: absent)"
    return found


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]


def needed_distributions(pyproject: str) -> list[str]:
    """What the engine, its workers and the tests import: the project's dependencies but
    the language server's, and pytest."""
    names = [_requirement_name(r) for r in tomllib.loads(pyproject)["project"]["dependencies"]]
    return [n for n in names if n not in SERVER_ONLY] + list(EXTRA_NEEDS)


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_distributions(
    pyproject: str, installed: Callable[[str], bool] = _installed
) -> list[str]:
    return [name for name in needed_distributions(pyproject) if not installed(name)]


def unimportable(modules: tuple[str, ...] = RUN_MODULES) -> list[str]:
    """Top-level modules that importing what the run uses fails on, as distribution
    names (`tree_sitter_cuda` -> tree-sitter-cuda), from a fresh interpreter at the root."""
    done = subprocess.run(
        [sys.executable, "-c", _SMOKE, *modules],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        return [f"(the import check failed: {done.stderr.strip()[-200:]})"]
    return [name.split(".")[0].replace("_", "-") for name in json.loads(done.stdout)]


def wheel_command(names: list[str], python: str) -> str:
    """The `pip download` line that fetches wheels for `names` on another machine, for the
    Python version `python` ("3.12") on x86-64 Linux; its folder is then --wheels."""
    platforms = " ".join(f"--platform {p}" for p in WHEEL_PLATFORMS)
    return (
        f"python3 -m pip download --no-deps --only-binary=:all: --python-version {python} "
        f"--implementation cp {platforms} -d .whl {' '.join(names)}"
    )


def install_wheels(folder: Path) -> str:
    """Install every wheel in `folder` into this interpreter and put the repository on its
    path (a `.pth`, which sandboxed workers read too); "" or what went wrong."""
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        return f"no wheels in {_shown_path(folder)}"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-compile", "--no-cache-dir", *wheels],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        return f"pip install failed: {(done.stderr or done.stdout).strip()[-400:]}"
    (Path(sysconfig.get_paths()["purelib"]) / "htam-repository.pth").write_text(f"{ROOT}\n")
    importlib.invalidate_caches()
    return ""


def torch_reason() -> str | None:
    """None when torch can use the GPU, else why not (torch imported only here)."""
    try:
        import torch
    except ImportError as error:
        return f"torch cannot be imported: {error}"
    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
            "torch.cuda.is_available() is False"
        )
    return None


def device_report(gpu: dict[str, Any]) -> dict[str, Any]:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "capability": f"sm_{major}{minor}",
        "driver": gpu["driver"],
        "cuda_runtime": torch.version.cuda,
        "nvcc": gpu["nvcc"],
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "absent_distributions": gpu.get("absent_distributions", []),
    }


# --- commands as recorded --------------------------------------------------------------------


def _shown_path(path: Path | str, home: Path | None = None) -> str:
    text = str(path)
    if home is not None and text.startswith(str(home)):
        return "$HTAM_HOME" + text[len(str(home)) :]
    if text.startswith(str(ROOT) + os.sep):
        return text[len(str(ROOT)) + 1 :]
    return text


def shown(argv: list[str], home: Path | None = None) -> str:
    """A command line as recorded: this interpreter is `python`, paths are relative to
    the repository, and the run's temporary home is `$HTAM_HOME`."""
    words = ["python" if word == sys.executable else _shown_path(word, home) for word in argv]
    return " ".join(words)


def _run(argv: list[str], timeout_s: float, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HTAM_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env
    )


# --- the measurements --------------------------------------------------------------------------


def gpu_tests(home: Path, timeout_s: float) -> dict[str, Any]:
    """`pytest -m gpu` on the whole suite but this script's own (slow, recursive) test."""
    argv = [
        sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
        "tests", "--ignore", "tests/test_bench_gpu_examples.py",
    ]  # fmt: skip
    started = time.monotonic()
    try:
        done = _run(argv, timeout_s, home)
    except subprocess.TimeoutExpired:
        return {"command": shown(argv), "error": f"timed out after {timeout_s:.0f} s"}
    lines = done.stdout.strip().splitlines()
    return {
        "command": shown(argv),
        "returncode": done.returncode,
        "summary": lines[-1] if lines else done.stderr.strip()[-300:],
        "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))],
        "wall_s": round(time.monotonic() - started, 1),
    }


def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile (for a confidence interval from few re-evaluations), by
    bisection on the CDF integrated with Simpson's rule."""
    scale = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x: float, steps: int = 2000) -> float:
        h = x / steps
        weights = (1 if i in (0, steps) else 4 if i % 2 else 2 for i in range(steps + 1))
        pdf = (scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1))
        return 0.5 + h / 3 * sum(w * p for w, p in zip(weights, pdf, strict=True))

    low, high = 0.0, 1.0
    while cdf(high) < probability:
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2


def log_interval(values: list[float], extra_log_se: float = 0.0) -> dict[str, Any] | None:
    """Geometric mean of positive ratios with a 95 % interval (t on their logs); an
    independent error of `extra_log_se` (the start's own spread) widens it."""
    good = [v for v in values if v > 0]
    if not good:
        return None
    logs = [math.log(v) for v in good]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return {"geomean": math.exp(centre), "low": None, "high": None, "n": len(logs)}
    se = math.hypot(statistics.stdev(logs) / math.sqrt(len(logs)), extra_log_se)
    half = t_quantile(1 - (1 - CONFIDENCE) / 2, len(logs) - 1) * se
    return {
        "geomean": math.exp(centre),
        "low": math.exp(centre - half),
        "high": math.exp(centre + half),
        "n": len(logs),
    }


def _start_log_se(start: dict[str, Any]) -> float:
    """Standard error of the log of the start's median runtime, from its own samples."""
    samples = [s for s in (start.get("samples") or {}).get("candidate", []) if s > 0]
    if len(samples) < 2:
        return 0.0
    logs = [math.log(s) for s in samples]
    return statistics.stdev(logs) / math.sqrt(len(logs))


def _eval_once(argv: list[str], home: Path, timeout_s: float) -> dict[str, Any]:
    """One `htam eval --no-cache` verdict, or {"error": why}."""
    try:
        done = _run(argv, timeout_s, home)
        verdict = json.loads(done.stdout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    except json.JSONDecodeError:
        return {"error": (done.stderr or done.stdout)[-300:]}
    return verdict if isinstance(verdict, dict) else {"error": "unexpected output"}


def repeat_eval(task: Path, source: str, home: Path, deadline: float) -> dict[str, Any]:
    """Evaluate one candidate REPEATS times in fresh workers (no verdict cache)."""
    candidate = home / f"best-{task.parent.name}.py"
    candidate.write_text(source)
    # each timed until narrow (no question): the CV of full timings
    argv = [sys.executable, "-m", "htam_engine.cli", "eval", str(task), str(candidate),
            "--device", "cuda", "--no-cache", "--json", "--decide", "none"]  # fmt: skip
    verdicts, errors = [], []
    for _ in range(REPEATS):
        left = deadline - time.monotonic()
        if left < MIN_CALL_S:
            errors.append("skipped: time budget")
            continue
        verdict = _eval_once(argv, home, min(EVAL_TIMEOUT_S, left))
        if verdict.get("correct") and verdict.get("runtime_ms") and verdict.get("speedup"):
            verdicts.append(verdict)
        else:
            errors.append(str(verdict.get("error") or "incorrect")[-300:])
    runtimes = [float(v["runtime_ms"]) for v in verdicts]
    return {
        "command": shown(argv, home),
        "runtimes_ms": runtimes,
        "speedups_vs_pytorch": [float(v["speedup"]) for v in verdicts],
        "runtime_cv": statistics.stdev(runtimes) / statistics.fmean(runtimes)
        if len(runtimes) > 1
        else None,
        "sandbox": sorted({str(v.get("sandbox", "unknown")) for v in verdicts}),
        "errors": errors,
    }


def optimize(path: Path, steps: int, seed: int, home: Path, timeout_s: float) -> dict[str, Any]:
    """One `htam optimize` run; a failed run is recorded with its error, never raised."""
    output = home / f"out-{path.parent.name}"
    argv = [sys.executable, "-m", "htam_engine.cli", "optimize", str(path),
            "--provider", "offline", "--device", "cuda", "--steps", str(steps),
            "--seed", str(seed), "--json", "--output", str(output)]  # fmt: skip
    record: dict[str, Any] = {"example": path.parent.name, "command": shown(argv, home)}
    try:
        done = _run(argv, timeout_s, home)
    except subprocess.TimeoutExpired:
        return {**record, "error": f"timed out after {timeout_s:.0f} s"}
    try:  # `htam optimize` exits 1 with its JSON when nothing correct was found
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr.strip() or done.stdout.strip())[-600:]
        return {**record, "error": f"exit {done.returncode}: {tail}"}
    return {**record, "exit_code": done.returncode, "result": result}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """One example's row: correctness, both speedups with intervals, CV, sandbox mode."""
    result, repeats = run["result"], run["repeats"]
    start = result.get("start_verdict") or {}
    start_ms = start.get("runtime_ms")
    over_start = [start_ms / ms for ms in repeats["runtimes_ms"]] if start_ms else []
    steps = result.get("steps", [])
    return {
        "example": run["example"],
        "correct": bool(result.get("correct")) and not repeats["errors"],
        "steps": [f"{s['global']}/{s['local']}: {s.get('status')}" for s in steps],
        "loop_speedup_over_start": result.get("best_speedup"),
        "loop_speedup_over_pytorch": result.get("ref_speedup"),
        "start_speedup_over_pytorch": start.get("speedup"),
        "speedup_over_start": log_interval(over_start, _start_log_se(start)),
        "speedup_over_pytorch": log_interval(repeats["speedups_vs_pytorch"]),
        "runtime_cv": repeats["runtime_cv"],
        "sandbox": sorted(set(repeats["sandbox"]) | {str(start.get("sandbox", "unknown"))}),
        "errors": repeats["errors"],
        "commands": [run["command"], repeats["command"]],
    }


def run_examples(
    examples: list[Path], steps: int, seed: int, home: Path, deadline: float
) -> list[dict[str, Any]]:
    rows = []
    for path in examples:
        left = deadline - time.monotonic() - REPEAT_RESERVE_S
        if left < MIN_CALL_S:
            rows.append({"example": path.parent.name, "error": "skipped: time budget"})
            continue
        run = optimize(path, steps, seed, home, left)
        if "error" in run:
            rows.append(run)
            continue
        run["repeats"] = repeat_eval(path, run["result"]["best_source"], home, deadline)
        rows.append(summarize(run))
    return rows


# --- the report ----------------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _interval(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    if cell["low"] is None:
        return f"{_x(cell['geomean'])} (n={cell['n']})"
    return f"{_x(cell['geomean'])} [{cell['low']:.2f}, {cell['high']:.2f}]"


def markdown(out: dict[str, Any]) -> str:
    if "skipped" in out or "blocked" in out:
        word = "skipped" if "skipped" in out else "blocked"
        needs = f" Needs: {', '.join(out['needs'])}." if out.get("needs") else ""
        return f"GPU section {word}: {out.get('skipped') or out.get('blocked')}.{needs}"
    env, tests = out["environment"], out["gpu_tests"]
    lines = [
        f"GPU: {env['device']} ({env['capability']}), driver {env['driver']}, CUDA "
        f"{env['cuda_runtime']} (nvcc {env['nvcc']}), torch {env['torch']}; offline provider, "
        f"{out['steps']} steps per example, seed {out['seed']}; {out['wall_s']:.0f} s in all.",
        f"`pytest -m gpu`: {tests.get('summary') or tests.get('error')}.",
        "",
        f"| example | correct | best vs start (95 % CI, {REPEATS} re-evaluations) | "
        "best vs PyTorch (95 % CI) | start vs PyTorch | runtime CV | sandbox |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in out["runs"]:
        if "error" in r:
            lines.append(f"| {r['example']} | {r['error'].splitlines()[-1][:200]} | | | | | |")
            continue
        cv = "-" if r["runtime_cv"] is None else f"{100 * r['runtime_cv']:.1f} %"
        lines.append(
            f"| {r['example']} | {r['correct']} | {_interval(r['speedup_over_start'])} | "
            f"{_interval(r['speedup_over_pytorch'])} | {_x(r['start_speedup_over_pytorch'])} | "
            f"{cv} | {', '.join(r['sandbox'])} |"
        )
    return "\n".join(lines)


def measure(args: argparse.Namespace, gpu: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + args.budget_s
    examples = sorted(ROOT.glob("examples/*/cuda_naive.py"))[: 2 if args.quick else None]
    with tempfile.TemporaryDirectory(prefix="htam-gpu-bench-") as tmp:
        home = Path(tmp)
        tests = gpu_tests(home, max(MIN_CALL_S, TESTS_SHARE * args.budget_s))
        runs = run_examples(examples, args.steps, args.seed, home, deadline)
    return {
        "environment": device_report(gpu),
        "steps": args.steps,
        "seed": args.seed,
        "gpu_tests": tests,
        "runs": runs,
        "wall_s": time.monotonic() - started,
    }


def prepare(args: argparse.Namespace) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(a result that ends the run here: skipped or blocked, or None; the GPU probe)."""
    gpu = probe_gpu()
    if "reason" in gpu:
        return {"skipped": gpu["reason"]}, gpu
    pyproject = (ROOT / "pyproject.toml").read_text()
    problem = install_wheels(args.wheels) if args.wheels else ""
    absent = missing_distributions(pyproject)
    needed = unimportable()
    if problem or needed:
        names = sorted(set(needed) | set(absent))
        python = ".".join(map(str, sys.version_info[:2]))
        return {
            "blocked": problem or f"this interpreter cannot import {', '.join(needed)}",
            "needs": names,
            "how": f"{wheel_command(names, python)} (and what their wheels' Requires-Dist "
            "name); then rerun with --wheels .whl",
            "gpu": gpu,
        }, gpu
    reason = torch_reason()
    if reason:
        return {"blocked": reason, "gpu": gpu}, gpu
    gpu["absent_distributions"] = absent  # declared, but not imported by this run
    return None, gpu


def write(out: dict[str, Any], path: Path) -> Path:
    """Write the JSON (and, for a measured run, its Markdown beside it); a skipped or
    blocked run never overwrites a measured result: it goes to `<name>.skipped.json`."""
    measured = "runs" in out
    if not measured and path.exists() and "runs" in json.loads(path.read_text() or "{}"):
        path = path.with_suffix(".skipped.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    if measured:
        path.with_suffix(".md").write_text(out["markdown"] + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two examples")
    parser.add_argument("--steps", type=int, default=3, help="steps per example (default 3)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="seconds in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wheels", type=Path, help="install these wheels first (no index)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_examples.json"
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    stopped, gpu = prepare(args)
    out = stopped if stopped is not None else measure(args, gpu)
    out["invocation"] = shown([sys.executable, *sys.argv])
    out["markdown"] = markdown(out)
    written = write(out, args.out)
    print(out["markdown"])
    print(f"wrote {_shown_path(written)}", file=sys.stderr)
    return 1 if "blocked" in out else 0


if __name__ == "__main__":
    sys.exit(main())
