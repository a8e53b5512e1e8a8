"""Every HTAM benchmark, one command, one JSON result and one Markdown report.

    .venv/bin/python benchmarks/run_all.py [--quick] [--seed S] --out benchmarks/results

Runs each benchmark script as a subprocess (so one failing section cannot take the
others down), in this order: simulation (policy quality), prompt_budget, real_loop
(CPU), gpu_examples (skips without a GPU), and the other owners' bench_policy,
bench_compile and bench_lsp when they exist. Writes OUT/results.json (machine, seeds,
every section's command, exit status, wall time and data) and OUT/results.md.
--quick sizes everything for CI (a few minutes on two shared cores, most of it the
real loop's compile and timing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SECTION_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    script: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)


SECTIONS = (
    Section("simulation", "Policy quality in simulation", "simulation.py"),
    Section("prompt_budget", "Prompt budget", "prompt_budget.py", quick=("--sizes", "100", "1000")),
    Section("real_loop", "The real loop on CPU", "real_loop.py", quick=("--quick", "--steps", "1")),
    Section("gpu_examples", "GPU section", "gpu_examples.py"),
    Section(
        "bench_policy",
        "Cost of one selection + update (bench_policy)",
        "bench_policy.py",
        quick=("--sizes", "100", "1000", "10000", "--repeats", "5"),
    ),
    Section("bench_compile", "Compile cost (bench_compile)", "bench_compile.py", quick=()),
    Section("bench_lsp", "Editor latency (bench_lsp)", "bench_lsp.py"),
)


def machine() -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    return {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": commit or None,
    }


def _help(script: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    return done.stdout


def command(section: Section, quick: bool, seed: int, out_file: Path) -> tuple[list[str], bool]:
    """The section's command line, and whether its JSON comes on stdout (else in out_file).

    The other owners' scripts are asked for what their --help offers (--quick, --seed,
    --out or --json), so a script that changes its flags still runs.
    """
    flags = _help(HERE / section.script)
    script = (HERE / section.script).relative_to(REPO)  # run from the repository root
    args = [sys.executable, str(script), *(section.quick if quick else section.full)]
    if quick and "--quick" in flags and "--quick" not in args:
        args.append("--quick")
    if "--seed" in flags:
        args += ["--seed", str(seed)]
    if "--out" in flags:
        return [*args, "--out", str(out_file)], False
    return ([*args, "--json"], True) if "--json" in flags else (args, False)


def run_section(section: Section, quick: bool, seed: int, out_dir: Path) -> dict[str, Any]:
    if not (HERE / section.script).exists():
        return {"title": section.title, "status": "missing", "markdown": _missing(section)}
    out_file = out_dir / f"{section.name}.json"
    out_file.unlink(missing_ok=True)
    args, json_on_stdout = command(section, quick, seed, out_file)
    started = time.monotonic()
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=SECTION_TIMEOUT_S, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"title": section.title, "status": "timeout", "command": shown(args), "markdown": ""}
    wall = time.monotonic() - started
    data = _data(done.stdout if json_on_stdout else None, out_file)
    markdown = data.get("markdown") if isinstance(data.get("markdown"), str) else None
    if markdown is None and not json_on_stdout:  # a script that prints its table
        markdown = "\n".join(
            line for line in done.stdout.strip().splitlines() if not line.startswith("wrote ")
        )
    elif markdown is None:
        markdown = flat_table(data)
    return {
        "title": section.title,
        "status": "ok" if done.returncode == 0 else f"exit {done.returncode}",
        "command": shown(args),
        "wall_s": wall,
        "data": data,
        "markdown": markdown or "",
        "stderr_tail": done.stderr.strip()[-1500:] if done.returncode else "",
    }


def shown(args: list[str]) -> list[str]:
    """The command as a reader reruns it from the repository root: no machine's paths."""
    python = [".venv/bin/python"] if Path(sys.executable).is_relative_to(REPO) else ["python"]
    rest = [str(Path(a).relative_to(REPO)) if Path(a).is_relative_to(REPO) else a for a in args[1:]]
    return python + rest


def flat_table(data: dict[str, Any], prefix: str = "") -> str:
    """A two-column table of every number in `data` (nested keys joined by dots)."""
    rows = [f"| {key} | {value} |" for key, value in _leaves(data, prefix)]
    return "\n".join(["| measurement | value |", "| --- | --- |", *rows]) if rows else ""


def _leaves(data: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _leaves(value, name + ".")
        elif isinstance(value, float):
            out.append((name, f"{value:.4g}"))
        elif isinstance(value, int | str | bool):
            out.append((name, str(value)))
    return out


def _missing(section: Section) -> str:
    return f"`benchmarks/{section.script}` does not exist in this checkout yet."


def _data(stdout: str | None, out_file: Path) -> dict[str, Any]:
    text = stdout if stdout is not None else (out_file.read_text() if out_file.exists() else "")
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {"unparsed_output": text[-2000:]}
    return data if isinstance(data, dict) else {"value": data}


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# HTAM benchmarks",
        "",
        f"{'Quick' if result['quick'] else 'Full'} run, seed {result['seed']}, "
        f"{m['date_utc']}, commit {m['git_commit']}.",
        f"Machine: {m['platform']}, {m['cores']} cores, Python {m['python']}, "
        f"torch {m['torch']}, GPU: {m['gpu'] or 'none'}.",
        "Machines here are noisy: read ratios and medians from one run, not absolute times.",
    ]
    for section in result["sections"].values():
        wall = f" ({section['wall_s']:.0f} s)" if "wall_s" in section else ""
        lines += ["", f"## {section['title']}{wall}", ""]
        if section["status"] not in ("ok", "missing"):
            lines.append(f"**{section['status']}**: `{' '.join(section.get('command', []))}`")
            if section.get("stderr_tail"):
                lines += ["", "```", section["stderr_tail"], "```"]
        lines.append(section["markdown"])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    parser.add_argument(
        "--only", nargs="+", choices=[s.name for s in SECTIONS], help="run these sections only"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in SECTIONS if not args.only or s.name in args.only]
    result: dict[str, Any] = {
        "quick": args.quick,
        "seed": args.seed,
        "machine": machine(),
        "sections": {},
    }
    for section in chosen:
        print(f"running {section.name} ...", file=sys.stderr, flush=True)
        result["sections"][section.name] = run_section(section, args.quick, args.seed, args.out)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(report(result))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
