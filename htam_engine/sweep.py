"""`htam bench kernelbench`: optimize many KernelBench problems and score them the way
KernelBench does (fast_p over all problems, geometric-mean speedup over PyTorch).

Each problem runs as its own `htam optimize PROBLEM --json` process (a crash or a hang in
one problem cannot take the sweep down), in a folder of its own under the output folder;
a problem whose folder already holds `result.json` is not run again (resumable). Problems
run on local workers, or as tasks on an existing Ray cluster with `--ray ADDRESS`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from htam_engine.errors import UserError
from htam_engine.evaluate.cli import add_policy_arguments
from htam_engine.formatting import format_speedup
from htam_engine.machine import DEVICE_CHOICES
from htam_engine.paths import write_whole
from htam_engine.task import parse_allow_torch

FAST_P = (1.0, 1.5, 2.0)  # fast_1 is KernelBench's Fast@1; fast_0 is the correct rate
PROBLEM_TIMEOUT_S = 4 * 3600
_PROBLEM_FILE = re.compile(r"^(?P<id>\d+)_(?P<name>.+)\.py$")


@dataclass(frozen=True)
class Problem:
    level: int
    id: int
    name: str
    path: Path

    @property
    def key(self) -> str:
        return f"level{self.level}/{self.id}_{self.name}"


@dataclass(frozen=True)
class ProblemResult:
    """How one problem ended; `speedup` is the best correct candidate over PyTorch."""

    key: str
    level: int
    id: int
    status: str  # "done" | the kind of the error that stopped it ("no_start", "user_error"...)
    correct: bool
    speedup: float | None
    over_start: float | None
    steps: int
    prompt_tokens: int
    wall_s: float
    message: str = ""

    @classmethod
    def from_run(cls, problem: Problem, done: dict[str, Any], wall_s: float) -> ProblemResult:
        """From the one JSON document `htam optimize --json` printed (a result or an error)."""
        error = done.get("error")
        steps = done.get("steps") or []
        return cls(
            key=problem.key,
            level=problem.level,
            id=problem.id,
            status=str(error.get("kind", "error")) if error else "done",
            correct=bool(done.get("correct")),
            speedup=done.get("ref_speedup") if done.get("correct") else None,
            over_start=done.get("best_speedup"),
            steps=len(steps),
            prompt_tokens=sum(int(s.get("prompt_tokens") or 0) for s in steps),
            wall_s=wall_s,
            message=str(error.get("message", "")) if error else _why(done),
        )


def _why(done: dict[str, Any]) -> str:
    """How a finished run stopped, and what its numbers can say (correctness only)."""
    stopped, note = str(done.get("stopped", "")), str(done.get("note") or "")
    return f"{stopped}; {note}" if note else stopped


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="sweeps over problem sets")
    suites = bench.add_subparsers(dest="suite", metavar="SUITE", required=True)
    p = suites.add_parser(
        "kernelbench",
        help="optimize KernelBench problems and report KernelBench's metrics",
        description=__doc__,
    )
    p.add_argument("path", help="a KernelBench checkout, its KernelBench/ folder or a level folder")
    p.add_argument("--level", type=int, action="append", help="level(s) to run (default: all)")
    p.add_argument("--problems", help="problem ids, e.g. 1-10,19 (default: all)")
    p.add_argument("--steps", type=int, default=4, help="steps T per problem (default 4)")
    p.add_argument("--provider", default="auto", help="LLM provider (as for htam optimize)")
    p.add_argument("--model", help="model name for the provider")
    p.add_argument("--base-url", help="base URL of an OpenAI-compatible server")
    p.add_argument("--cassette", help="JSONL cassette for --provider replay")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--out", default=".htam-bench", help="output folder (one folder a problem)")
    p.add_argument("--jobs", type=int, default=1, help="problems at once on this machine")
    p.add_argument("--ray", metavar="ADDRESS", help="run problems on a Ray cluster ('auto')")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    add_policy_arguments(p)  # passed to every problem's `htam optimize`
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    problems = select(discover(Path(args.path)), args.level, parse_ids(args.problems))
    if not problems:
        raise UserError(f"no KernelBench problems selected under {args.path}")
    out = Path(args.out)
    started = time.monotonic()
    results = run_all(problems, out, optimize_argv(args), args.jobs, args.ray)
    summary = {
        "metrics": metrics(results),
        "wall_s": time.monotonic() - started,
        "problems": [asdict(r) for r in results],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(markdown(summary))
    if args.json:
        print(json.dumps(summary))
    else:
        print(markdown(summary), file=sys.stderr)
    return 0


# --- problems --------------------------------------------------------------------------


def discover(root: Path) -> list[Problem]:
    """Every `<id>_<name>.py` in `levelN` folders at or under `root` (a level folder too)."""
    if not root.is_dir():
        raise UserError(f"{root} is not a folder")
    folders = [root] if re.fullmatch(r"level\d+", root.name) else []
    folders += sorted(p for p in root.glob("level*") if p.is_dir())
    folders += sorted(p for p in root.glob("KernelBench/level*") if p.is_dir())
    found = []
    for folder in folders:
        level = int(folder.name.removeprefix("level"))
        for path in folder.glob("*.py"):
            match = _PROBLEM_FILE.match(path.name)
            if match:
                found.append(Problem(level, int(match["id"]), match["name"], path))
    return sorted(found, key=lambda p: (p.level, p.id))


def parse_ids(spec: str | None) -> set[int] | None:
    """'1-10,19' -> {1, ..., 10, 19}; None selects every problem."""
    if not spec:
        return None
    ids: set[int] = set()
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UserError(f"--problems: {part!r} is not an id or a range like 1-10")
        ids.update(range(int(low), int(high or low) + 1))
    return ids


def select(
    problems: list[Problem], levels: Sequence[int] | None, ids: set[int] | None
) -> list[Problem]:
    return [
        p for p in problems if (not levels or p.level in levels) and (ids is None or p.id in ids)
    ]


# --- running ---------------------------------------------------------------------------


def optimize_argv(args: argparse.Namespace) -> list[str]:
    """The `htam optimize` flags every problem shares."""
    argv = ["--steps", str(args.steps), "--provider", args.provider, "--device", args.device]
    for flag, value in (("--model", args.model), ("--base-url", args.base_url)):
        argv += [flag, value] if value else []
    if getattr(args, "allow_torch", None) is not None:
        allowed = parse_allow_torch(args.allow_torch, "--allow-torch")  # refused here, once
        argv += ["--allow-torch", ",".join(allowed) or "none"]
    if getattr(args, "scale", None) is not None:
        argv += ["--scale", repr(args.scale)]
    return argv + (["--cassette", str(Path(args.cassette).resolve())] if args.cassette else [])


def run_all(
    problems: Sequence[Problem], out: Path, flags: list[str], jobs: int, ray: str | None
) -> list[ProblemResult]:
    out.mkdir(parents=True, exist_ok=True)
    todo = [(p, out / p.key) for p in problems]
    return (_on_ray(ray) if ray else _on_local(jobs))(todo, flags)


def run_problem(problem: Problem, folder: Path, flags: list[str]) -> ProblemResult:
    """One problem in its own process and folder; an earlier finished result is reused."""
    done_file = folder / "result.json"
    if done_file.is_file():
        return ProblemResult(**json.loads(done_file.read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "htam_engine.cli", "optimize", str(problem.path.resolve())]
    argv += [*flags, "--output", str(folder / "run"), "--json"]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBLEM_TIMEOUT_S, cwd=folder
        )
        (folder / "stderr.log").write_text(proc.stderr)
        document = _last_json(proc.stdout) or {
            "error": {"kind": "crash", "message": f"exit {proc.returncode}: {proc.stderr[-300:]}"}
        }
    except subprocess.TimeoutExpired:
        document = {"error": {"kind": "timeout", "message": f"over {PROBLEM_TIMEOUT_S} s"}}
    result = ProblemResult.from_run(problem, document, time.monotonic() - started)
    write_whole(done_file, json.dumps(asdict(result), indent=2))
    return result


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


Runner = Callable[[Sequence[tuple[Problem, Path]], list[str]], list[ProblemResult]]


def _on_local(jobs: int) -> Runner:
    def run_here(todo: Sequence[tuple[Problem, Path]], flags: list[str]) -> list[ProblemResult]:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(lambda item: run_problem(item[0], item[1], flags), todo))

    return run_here


def _on_ray(address: str) -> Runner:
    """Problems as Ray tasks: `auto` or an address joins a cluster, `local` starts one here."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'htam-lsp[ray]'") from None

    def run_on_ray(todo: Sequence[tuple[Problem, Path]], flags: list[str]) -> list[ProblemResult]:
        if not ray.is_initialized():
            ray.init(address=None if address == "local" else address)
        remote = ray.remote(num_cpus=1)(run_problem)
        return list(ray.get([remote.remote(p, folder, flags) for p, folder in todo]))

    return run_on_ray


# --- metrics ---------------------------------------------------------------------------


def metrics(results: Sequence[ProblemResult]) -> dict[str, Any]:
    """KernelBench's metrics over ALL problems (a failure counts in every denominator).

    fast_p: the share of problems that are correct and faster than PyTorch by more than p
    (fast_0 is the correct rate: a correct kernel that was not timed, Triton under its
    interpreter, counts there and nowhere faster). geomean_correct: over correct timed
    problems only; geomean_all: a problem without a timed correct kernel counts as 1.0x
    (PyTorch is kept).
    """
    n = len(results)
    speedups = [r.speedup for r in results if r.correct and r.speedup]
    fast = {f"fast_{p:g}": sum(s > p for s in speedups) / n for p in FAST_P}
    logs = [math.log(s) for s in speedups]
    return {
        "problems": n,
        "fast_0": sum(r.correct for r in results) / n,
        "untimed": sum(r.correct and not r.speedup for r in results),
        **fast,
        "geomean_correct": math.exp(sum(logs) / len(logs)) if logs else None,
        "geomean_all": math.exp(sum(logs) / n),
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "problem_wall_s": sum(r.wall_s for r in results),
    }


def markdown(summary: dict[str, Any]) -> str:
    m = summary["metrics"]
    lines = [
        "| problems | correct (fast_0) | fast_1 | fast_1.5 | fast_2 "
        "| geomean (correct) | geomean (all, failure = 1x) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {m['problems']} | {m['fast_0']:.1%} | {m['fast_1']:.1%} | {m['fast_1.5']:.1%} "
        f"| {m['fast_2']:.1%} | {format_speedup(m['geomean_correct'])} "
        f"| {format_speedup(m['geomean_all'])} |",
        "",
        f"Prompt tokens: {m['prompt_tokens']}; wall time {summary['wall_s']:.0f} s.",
        "",
        "| problem | outcome | vs PyTorch | vs start | steps | why |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in summary["problems"]:
        outcome = (
            r["status"] if not r["correct"] else "correct" if r["speedup"] else "correct, untimed"
        )
        lines.append(
            f"| {r['key']} | {outcome} | {format_speedup(r['speedup'])} "
            f"| {format_speedup(r['over_start'])} "
            f"| {r['steps']} | {r['message'].replace('|', '/')[:240]} |"
        )
    return "\n".join(lines) + "\n"
