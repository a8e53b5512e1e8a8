"""`htam optimize`: run the HTAM loop on a task and write its results to a folder."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from htam_engine import events
from htam_engine.errors import NoStartError, ReferenceFailed, UserError
from htam_engine.evaluate.cli import add_baseline_argument, add_policy_arguments
from htam_engine.formatting import (
    format_bounded,
    format_duel,
    format_interval,
    format_roofline,
    format_speedup,
)
from htam_engine.machine import DEVICE_CHOICES
from htam_engine.policy.global_select import MODES
from htam_engine.vocabulary import PROVIDERS

if TYPE_CHECKING:
    from htam_engine.loop import RunResult


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "optimize",
        help="optimize a kernel task for N steps (the HTAM loop)",
        description=(
            "Run T steps of HTAM on TASK: pick a direction from the memory, write the next "
            "implementation (LLM or mechanical rewrite), compile, verify and time it, learn. "
            "Writes the best implementation, a Markdown report and a plot to the output folder."
        ),
    )
    p.add_argument("task", help="implementation .py (with `# htam: reference=...`), bound .cu")
    p.add_argument("--steps", type=int, default=6, help="number of steps T (default 6)")
    p.add_argument("--provider", choices=PROVIDERS, default="auto", help="LLM provider")
    p.add_argument("--model", help="model name for the provider")
    p.add_argument("--base-url", help="base URL of an OpenAI-compatible server")
    p.add_argument("--cassette", help="JSONL cassette for --provider replay")
    p.add_argument("--record", help="record every LLM call of this run to this cassette")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument(
        "--no-cache", action="store_true", help="time every candidate afresh (the start too)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the policy's sampling")
    p.add_argument(
        "--selection",
        choices=MODES,
        default="htam",
        help="how directions are picked: htam (the memory's transitions, default) or an "
        "ablation to compare against (flat retrieval, random, greedy, ...)",
    )
    p.add_argument("--start", help="take the starting implementation from this file")
    p.add_argument("--output", help="output folder (default .htam-out/<task>-<run id>)")
    p.add_argument("--candidates", type=int, default=1, help="LLM answers per step (best-of-k)")
    p.add_argument(
        "--exclude",
        type=_local_ids,
        default=(),
        metavar="ID[,ID...]",
        help="strategies (local ids) never to choose, e.g. those that failed in earlier runs",
    )
    p.add_argument("--budget-tokens", type=int, help="stop the run's LLM calls past N tokens")
    p.add_argument("--budget-usd", type=float, help="stop the run's LLM calls past X dollars")
    p.add_argument("--json", action="store_true", help="print one JSON result on stdout")
    p.add_argument("--events", action="store_true", help="print JSON-line events on stdout")
    add_baseline_argument(p)
    add_policy_arguments(p)  # --allow-torch, --scale
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from htam_engine.evaluate.sizes import refuse_if_too_large
    from htam_engine.llm import LLMError, RunBudget, make_provider
    from htam_engine.loop import LoopConfig, Optimizer
    from htam_engine.memory import MemoryStore
    from htam_engine.policy import PolicyConfig
    from htam_engine.report import write_outputs
    from htam_engine.task import load_task, with_policy, with_start

    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    task = load_task(Path(args.task))
    if args.start:
        task = with_start(task, Path(args.start))
    task = with_policy(task, args.allow_torch, args.scale)
    if args.candidates < 1:
        raise UserError("--candidates must be at least 1")
    try:
        budget = (
            RunBudget(max_tokens=args.budget_tokens, max_usd=args.budget_usd)
            if args.budget_tokens is not None or args.budget_usd is not None
            else None
        )
        provider, why = make_provider(
            args.provider,
            model=args.model,
            base_url=args.base_url,
            cassette=args.cassette,
            record=args.record,
            budget=budget,
        )
    except LLMError as error:
        raise UserError(str(error)) from None
    start_source = task.impl_source or ""
    console = Console(stderr=True, quiet=args.json or args.events)
    console.print(f"[bold]provider:[/] {why}")
    display = _Display(console, args.events, args.steps)
    name = provider.name if provider else "offline"
    display.emit(events.Start(task.name, args.steps, name, why, args.device))
    refuse_if_too_large(task, args.device)  # a first one starts a judge: after the first event
    optimizer = Optimizer(
        task,
        start_source,
        provider=provider,
        store=MemoryStore(),
        config=LoopConfig(
            steps=args.steps,
            device=args.device,
            seed=args.seed,
            policy=PolicyConfig(mode=args.selection),
            candidates=args.candidates,
            exclude=args.exclude,
            use_cache=not args.no_cache,
        ),
        emit=display.emit,
    )
    result = _run_interruptibly(optimizer, console)
    if not start_source and result.stopped.startswith(NoStartError.kind):
        optimizer.persist()
        raise NoStartError(
            f"{result.stopped.removeprefix(NoStartError.kind + ': ')}; or set ANTHROPIC_API_KEY, "
            "OPENAI_API_KEY or HTAM_LLM_BASE_URL (or --provider replay --cassette FILE) and "
            f"htam has the LLM write ModelNew first. Provider: {why}"
        )
    if result.stopped.startswith("reference_error"):  # no candidate can be judged
        optimizer.persist()
        why = result.stopped.removeprefix("reference_error: ")
        raise ReferenceFailed(f"{task.name}: {why}; fix the reference first")
    if args.baseline == "compile":
        _versus_compile(result, task, start_source, args)
    output = Path(args.output or f".htam-out/{task.name}-{result.run_id}")
    optimizer.output_dir = str(write_outputs(result, output, suffix=Path(args.task).suffix))
    result = optimizer.result()
    optimizer.persist()
    summary = result.to_json()
    if provider is not None:
        summary["llm"] = {
            "usage": provider.usage.to_json(),
            "budget": budget.to_json() if budget else None,
        }
        console.print(provider.usage.line())
    if args.events:
        display.emit(result.result_event())
    elif args.json:
        print(json.dumps(summary))
    else:
        console.quiet = False
        console.print(_final_table(result))
        console.print(f"results in [bold]{result.output_dir}[/]")
        if result.note:
            console.print(f"[yellow]{result.note}[/]")
    if result.stopped == "interrupted":
        return 130
    llm_failed = result.stopped.startswith("LLM failed")
    return 0 if result.correct and not (llm_failed and not result.steps) else 1


def _versus_compile(result: RunResult, task: Any, start_source: str, args: Any) -> None:
    """`--baseline compile`: the start and the best timed against the torch.compile'd
    reference, once each at the end of the run (compiling costs seconds per evaluation)."""
    from htam_engine.evaluate.runner import versus_compile

    options = {"device": args.device, "use_cache": not args.no_cache}
    if result.start_verdict is not None:
        versus_compile(task, start_source, result.start_verdict, **options)
    best = next((s for s in result.steps if s.step == result.best_step), None)
    if best is not None:
        versus_compile(task, result.best_source, best.verdict, **options)


def _local_ids(text: str) -> tuple[str, ...]:
    """`--exclude a,b`: the local ids, in order, each once."""
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _run_interruptibly(optimizer: Any, console: Console) -> Any:
    """Run in a thread so Ctrl-C can stop the worker cleanly; learned steps are kept."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = optimizer.run()
        except BaseException as error:  # re-raised in the main thread below
            box["error"] = error

    thread = threading.Thread(target=target, name="htam-loop", daemon=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops as cleanly as Ctrl-C
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the worker, keeping what was learned[/]")
        optimizer.cancel.set()
        thread.join()
        optimizer.stopped = "interrupted"
        return optimizer.result()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _Display:
    """Either JSON-line events on stdout (for the language server) or a rich status line."""

    def __init__(self, console: Console, events: bool, steps: int) -> None:
        self.console, self.events, self.steps = console, events, steps
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def emit(self, event: events.Event) -> None:
        with self.lock:
            if self.events:
                sys.stdout.write(events.to_line(event) + "\n")
                sys.stdout.flush()
                return
            elapsed = time.monotonic() - self.started
            if isinstance(event, events.Phase):
                self.console.print(
                    f"[dim]{elapsed:6.1f}s[/] step {event.step}/{self.steps} "
                    f"{event.phase:<8} {event.global_id} {event.local_id}",
                    highlight=False,
                )
            elif isinstance(event, events.Step):
                self.console.print(
                    f"[bold]step {event.step}[/]: {event.global_id} -> {event.local_id}: "
                    f"[cyan]{event.status}[/] {format_speedup(event.speedup)}  ({event.reason})",
                    highlight=False,
                )


def _final_table(result: RunResult) -> Table:
    table = Table(title=f"HTAM on {result.task} ({result.provider})")
    # the direction of each step is in its line above; a narrow terminal folds, never cuts
    columns = ("step", "strategy", "outcome", "vs start", "vs best, in pairs", "vs PyTorch")
    for column in (*columns, "of roofline"):
        table.add_column(column, overflow="fold")
    for s in result.steps:
        table.add_row(
            str(s.step),
            s.local_id,
            s.status,
            format_speedup(s.speedup),
            format_duel(s.versus_best),
            format_interval(s.verdict),
            format_roofline(s.verdict),
        )
    best = format_bounded(result.best_speedup, result.best_interval)
    table.caption = (
        f"best: {best} over the start, "
        f"{format_speedup(result.best_ref_speedup)} vs PyTorch; stopped: {result.stopped}"
    )
    return table
