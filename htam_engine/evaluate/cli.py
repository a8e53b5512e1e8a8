"""`htam eval TASK CANDIDATE`: one candidate, one verdict."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from htam_engine.errors import UserError
from htam_engine.evaluate.verdict import Verdict
from htam_engine.machine import DEVICE_CHOICES
from htam_engine.task import (
    SCALED_SIZES,
    Task,
    guess_backend,
    load_task,
    parse_directive,
    with_policy,
)
from htam_engine.vocabulary import kind_of

ALLOW_TORCH_HELP = (
    "aten ops (mm, addmm, relu, ...) or groups (gemm, conv) that torch may compute "
    "without the candidate being not_custom_kernel; replaces htam.toml's "
    "[policy] allow_torch ('none': nothing)"
)
DECIDE_HELP = (
    "the question the timing answers: it stops as soon as the speedup's 95 %% interval "
    "lies wholly above or below SPEEDUP (default 1: is it faster than the reference?), "
    "or once the interval is narrow; 'none': only once it is narrow (a kernel far from "
    "the question gets a narrower interval, in more pairs)"
)
WATCH_HELP = (
    "evaluate again each time CANDIDATE or TASK changes, until Ctrl-C: a judge started "
    "while you edit serves the next evaluation, which skips the judge's start"
)
WATCH_POLL_S = 0.2
# what a terminal shows while `htam eval` works (`_Progress`), per phase
DOING = {"start": "starting", "compile": "compiling", "verify": "verifying", "time": "timing"}
SCALE_HELP = (
    f"shrink the problem: multiply its module-level sizes named {', '.join(SCALED_SIZES)} "
    "by F (0 < F <= 1), for problems too large for this machine"
)


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """`--allow-torch` and `--scale`, shared by eval, optimize and the sweep."""
    parser.add_argument("--allow-torch", metavar="OPS", help=ALLOW_TORCH_HELP)
    parser.add_argument("--scale", type=float, metavar="F", help=SCALE_HELP)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="compile, verify and time one candidate against its task's reference"
    )
    parser.add_argument("task", type=Path, help="reference .py or a bound implementation")
    parser.add_argument("candidate", type=Path, help="implementation to evaluate (.py or .cu)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    parser.add_argument("--json", action="store_true", help="print one JSON verdict on stdout")
    parser.add_argument("--no-cache", action="store_true", help="evaluate even if cached")
    parser.add_argument(
        "--decide", type=_question, default=1.0, metavar="SPEEDUP", help=DECIDE_HELP
    )
    parser.add_argument("--watch", action="store_true", help=WATCH_HELP)
    add_baseline_argument(parser)
    add_policy_arguments(parser)
    parser.set_defaults(handler=run)


def _question(text: str) -> float | None:
    if text == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"a speedup is a number above 0 or 'none', not {text!r}")
    return value


def add_baseline_argument(parser: argparse.ArgumentParser) -> None:
    """`--baseline eager|compile`, shared by eval and optimize."""
    parser.add_argument(
        "--baseline",
        choices=("eager", "compile"),
        default="eager",
        help="compile: also time against the torch.compile'd reference, in pairs "
        "(compile time excluded and recorded; a failed compile keeps eager's number)",
    )


def _human(verdict: Verdict) -> str:
    error = verdict.error
    if error:
        text = f"{error.kind}: {error.message}"
        return f"{text}\n{error.excerpt}" if error.excerpt else text
    if verdict.runtime_ms is None:  # correct, not timed (Triton's interpreter)
        return f"correct on {verdict.inputs_checked} input sets; {verdict.note}" + _notes(verdict)
    speed = _speed(verdict)
    flag = " (suspect: review before trusting)" if verdict.suspect else ""
    reference = f"{verdict.ref_runtime_ms:.4f}" if verdict.ref_runtime_ms is not None else "?"
    return (
        f"correct on {verdict.inputs_checked} input sets; {verdict.runtime_ms:.4f} ms vs "
        f"reference {reference} ms on {verdict.device}: {speed}{flag}"
        + (" [cached]" if verdict.cached else "")
        + _notes(verdict)
    )


def _speed(verdict: Verdict) -> str:
    """The speedup, with its interval, and the question it decided (`--decide`)."""
    from htam_engine.formatting import format_bounded

    interval = verdict.interval
    if interval is None:
        return f"{verdict.speedup:.3f}x" if verdict.speedup else "?"
    text = format_bounded(interval.estimate, (interval.low, interval.high))
    if (threshold := verdict.spread.get("decided_at")) is None:
        return text
    where = "above" if interval.estimate >= threshold else "below"  # decided: wholly
    return f"{text}, decided {where} {threshold:g}x after {interval.pairs} pairs"


def _notes(verdict: Verdict) -> str:
    """What the number was measured under: allowed library ops, a shrunk problem."""
    from htam_engine.formatting import format_compile
    from htam_engine.placement import Placement, Unplaced
    from htam_engine.roofline import describe

    notes = []
    placed = verdict.roofline
    if isinstance(placed, Placement):
        reference = placed.reference_fraction
        pytorch = f"; PyTorch at {100 * reference:.0f} %" if reference is not None else ""
        notes.append(f"roofline: {placed.bound}-bound, {describe(placed)}{pytorch}")
    elif isinstance(placed, Unplaced) and placed.why:
        notes.append(f"roofline: {placed.why}")
    if verdict.compile_baseline:
        notes.append(f"vs torch.compile: {format_compile(verdict)}")
    if verdict.torch_ops:
        notes.append(f"torch computed (allowed): {', '.join(verdict.torch_ops)}")
    if verdict.scaled:
        sizes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in verdict.scaled["sizes"].items())
        notes.append(f"problem scaled by {verdict.scaled['factor']:g} ({sizes})")
    return "".join(f"\n{note}" for note in notes)


def run(args: argparse.Namespace) -> int:
    if args.watch and args.json:
        raise UserError("--watch prints a verdict at each change, for people: drop --json")
    if args.watch:
        return _watch(args)
    task, candidate = _task(args)
    verdict = _verdict(args, task, candidate)
    code = _report(verdict, args.json)
    if verdict.inputs_checked:  # a judge served it: one is kept started for the next
        from htam_engine.evaluate import keeper, runner

        keeper.ensure(runner.judge_conditions(task, args.device))
    return code


def _task(args: argparse.Namespace) -> tuple[Task, str]:
    """The task as evaluated (its policy, the candidate in place), and the candidate."""
    task = with_policy(load_task(args.task), args.allow_torch, args.scale)
    try:
        candidate = args.candidate.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read candidate {args.candidate}: {error}") from None
    if task.impl_path is None or task.impl_path.resolve() != args.candidate.resolve():
        task = _with_candidate(task, args.candidate, candidate)
    return task, candidate


def _verdict(args: argparse.Namespace, task: Task, candidate: str) -> Verdict:
    from htam_engine.evaluate import evaluate, sizes

    progress = _Progress()
    try:
        progress("start")
        sizes.refuse_if_too_large(task, args.device)  # a first one: by the judge, held
        return evaluate(
            task,
            candidate,
            device=args.device,
            use_cache=not args.no_cache,
            baseline=args.baseline,
            decide=args.decide,
            on_phase=progress,
        )
    finally:
        progress.clear()


class _Progress:
    """The phase under way, on one line of stderr when it is a terminal (a log, a pipe
    or a test gets the verdict only), cleared before the verdict is printed."""

    def __init__(self) -> None:
        self.shown = sys.stderr.isatty()

    def __call__(self, phase: str) -> None:
        self._write(f"htam: {DOING.get(phase, phase)}...")

    def clear(self) -> None:
        self._write("")

    def _write(self, text: str) -> None:
        if self.shown:
            sys.stderr.write(f"\r\x1b[K{text}")
            sys.stderr.flush()


def _report(verdict: Verdict, as_json: bool) -> int:
    if as_json:
        json.dump(verdict.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(_human(verdict), file=sys.stderr, flush=True)
    return 0 if verdict.correct else 1


def _watch(args: argparse.Namespace) -> int:
    """Evaluate, then again at each change of the candidate or the task, until Ctrl-C.
    After each evaluation a judge is started for the next (`standby.keep_warm`): its
    workers' and its own torch imports and its input sets are made while you edit. A file
    that cannot be read mid-save, or a task that no longer loads, is said; the watch goes
    on."""
    from htam_engine.evaluate import standby

    files = (args.task, args.candidate)
    standby.keep_warm(True)
    try:
        stamps = _stamps(files)
        while True:
            try:
                _report(_verdict(args, *_task(args)), as_json=False)
            except UserError as error:
                print(f"htam: error: {error}", file=sys.stderr)
            print(f"htam: watching {args.candidate} (Ctrl-C stops)", file=sys.stderr, flush=True)
            stamps = _changed(files, stamps)
    finally:
        standby.keep_warm(False)


Stamps = tuple[tuple[int, int] | None, ...]


def _stamps(files: tuple[Path, ...]) -> Stamps:
    """Each file's modification time and size (None: missing)."""
    found: list[tuple[int, int] | None] = []
    for path in files:
        try:
            info = path.stat()
        except OSError:
            found.append(None)
            continue
        found.append((info.st_mtime_ns, info.st_size))
    return tuple(found)


def _changed(files: tuple[Path, ...], before: Stamps) -> Stamps:
    """The stamps of `files` once they differ from `before` and then held still for a
    poll (an editor may save in several writes)."""
    now = _stamps(files)
    while True:
        time.sleep(WATCH_POLL_S)
        later = _stamps(files)
        if later == now != before:
            return now
        now = later


def _with_candidate(task: Task, path: Path, source: str) -> Task:
    """`task` with `path` as the implementation (its own directive may name the entry)."""
    kind = kind_of(path)
    entry = parse_directive(source).get("entry") or task.entry
    return replace(
        task,
        impl_path=path,
        impl_source=source,
        kind=kind,
        entry=entry,
        backend=guess_backend(kind, source),
    )
