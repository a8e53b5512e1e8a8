"""`htam eval TASK CANDIDATE`: one candidate, one verdict."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Literal

from htam_engine.errors import UserError
from htam_engine.task import Task, guess_backend, load_task, parse_directive


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="compile, verify and time one candidate against its task's reference"
    )
    parser.add_argument("task", type=Path, help="reference .py or a bound implementation")
    parser.add_argument("candidate", type=Path, help="implementation to evaluate (.py or .cu)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--json", action="store_true", help="print one JSON verdict on stdout")
    parser.add_argument("--no-cache", action="store_true", help="evaluate even if cached")
    parser.set_defaults(handler=run)


def _human(verdict: dict) -> str:
    error = verdict["error"]
    if error:
        text = f"{error['kind']}: {error['message']}"
        return f"{text}\n{error['excerpt']}" if error["excerpt"] else text
    speed = f"{verdict['speedup']:.3f}x" if verdict["speedup"] else "?"
    flag = " (suspect: review before trusting)" if verdict["suspect"] else ""
    return (
        f"correct on {verdict['inputs_checked']} input sets; {verdict['runtime_ms']:.4f} ms vs "
        f"reference {verdict['ref_runtime_ms']:.4f} ms on {verdict['device']}: {speed}{flag}"
        + (" [cached]" if verdict["cached"] else "")
    )


def run(args: argparse.Namespace) -> int:
    from htam_engine.evaluate import evaluate

    task = load_task(args.task)
    try:
        candidate = args.candidate.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read candidate {args.candidate}: {error}") from None
    if task.impl_path is None or task.impl_path.resolve() != args.candidate.resolve():
        task = _with_candidate(task, args.candidate, candidate)
    verdict = evaluate(task, candidate, device=args.device, use_cache=not args.no_cache).to_json()
    if args.json:
        json.dump(verdict, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(_human(verdict), file=sys.stderr)
    return 0 if verdict["correct"] else 1


def _with_candidate(task: Task, path: Path, source: str) -> Task:
    """`task` with `path` as the implementation (its own directive may name the entry)."""
    kind: Literal["py", "cu"] = "cu" if path.suffix in (".cu", ".cuh") else "py"
    entry = parse_directive(source).get("entry") or task.entry
    return replace(
        task,
        impl_path=path,
        impl_source=source,
        kind=kind,
        entry=entry,
        backend=guess_backend(kind, source),
    )
