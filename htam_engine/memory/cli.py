"""`htam memory ...`: show, export, import, reset and draw the HTG."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from htam_engine.memory.model import START, Graph, MemoryDataError
from htam_engine.memory.store import MemoryStore, MemoryStoreError
from htam_engine.vocabulary import BACKENDS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "memory",
        help="inspect and manage the HTG memory (show, export, import, reset, graph)",
        description="The Hierarchical Transition Graph: seed priors plus what HTAM learned.",
    )
    commands = parser.add_subparsers(dest="memory_command", metavar="ACTION", required=True)

    show = commands.add_parser("show", help="list directions, strategies and transitions")
    _backend_option(show)
    show.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    show.set_defaults(handler=cmd_show)

    export = commands.add_parser("export", help="write everything learned to a JSON file")
    export.add_argument("file", type=Path, help="destination JSON file")
    export.set_defaults(handler=cmd_export)

    imp = commands.add_parser(
        "import", help="replace the learned memory with an exported JSON file (validated first)"
    )
    imp.add_argument("file", type=Path, help="a file written by `htam memory export`")
    imp.set_defaults(handler=cmd_import)

    reset = commands.add_parser("reset", help="forget everything learned (back to the seed)")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(handler=cmd_reset)

    graph = commands.add_parser("graph", help="print the transition graph as Mermaid or DOT")
    graph.add_argument("--format", choices=("mermaid", "dot"), default="mermaid", help="syntax")
    _backend_option(graph)
    graph.set_defaults(handler=cmd_graph)


def _backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="cuda", help="seed schema")


def _graph(backend: str) -> Graph:
    with _store() as store:
        try:
            return store.graph(backend)
        except MemoryDataError as error:
            raise _user_error(f"the memory store is damaged: {error}") from error


def _store() -> MemoryStore:
    try:
        return MemoryStore()
    except MemoryStoreError as error:
        raise _user_error(str(error)) from error


def _user_error(message: str) -> Exception:
    from htam_engine.errors import UserError

    return UserError(message)


def graph_json(graph: Graph) -> dict[str, Any]:
    """The `show --json` document: one object, node lists each carrying its `id`."""
    return {
        "backend": graph.backend,
        "seed_version": graph.seed_version,
        "global_nodes": [node.to_json() for node in graph.globals.values()],
        "local_nodes": [node.to_json() for node in graph.locals.values()],
        "edges": [edge.to_json() for edge in graph.edges.values()],
    }


def cmd_show(args: argparse.Namespace) -> int:
    graph = _graph(args.backend)
    if args.json:
        print(json.dumps(graph_json(graph), indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"HTAM memory ({graph.backend}, seed {graph.seed_version})")
    for column in ("direction / strategy", "mechanical", "attempts", "improved", "mean reward"):
        table.add_column(column)
    for gid, node in graph.globals.items():
        s = node.stats
        table.add_row(
            f"[bold]{node.name}[/bold]",
            "",
            str(s.attempts),
            str(s.improved),
            f"{s.mean_reward:+.3f}",
        )
        for local in graph.locals_of(gid):
            s = local.stats
            table.add_row(
                f"  {local.name}",
                local.mechanical or "",
                str(s.attempts),
                str(s.improved),
                f"{s.mean_reward:+.3f}",
            )
    Console(file=sys.stderr).print(table)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with _store() as store:
        try:
            store.export_json(args.file)
        except OSError as error:
            raise _user_error(f"cannot write {args.file}: {error.strerror}") from error
    print(f"exported the HTAM memory to {args.file}", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    with _store() as store:
        try:
            store.import_json(args.file)
        except (MemoryStoreError, MemoryDataError) as error:
            raise _user_error(str(error)) from error
    print(f"imported the HTAM memory from {args.file}", file=sys.stderr)
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise _user_error("refusing to reset without --yes (stdin is not a terminal)")
        answer = input("Forget everything HTAM learned? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing changed", file=sys.stderr)
            return 1
    with _store() as store:
        store.reset()
    print("the HTAM memory is back to its seed", file=sys.stderr)
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    graph = _graph(args.backend)
    print(to_mermaid(graph) if args.format == "mermaid" else to_dot(graph))
    return 0


def _edge_label(graph: Graph, src: str, dst: str) -> str:
    edge = graph.edges[(src, dst)]
    return f"p={edge.prior:.2f} n={edge.stats.weight:.1f}"


def to_mermaid(graph: Graph) -> str:
    lines = ["flowchart LR", f"  {START}(({START}))"]
    lines += [f'  {gid}["{node.name}"]' for gid, node in graph.globals.items()]
    lines += [f'  {src} -->|"{_edge_label(graph, src, dst)}"| {dst}' for src, dst in graph.edges]
    return "\n".join(lines)


def to_dot(graph: Graph) -> str:
    lines = [f'digraph "htam_{graph.backend}" {{', "  rankdir=LR;", f"  {START} [shape=circle];"]
    lines += [f'  {gid} [shape=box, label="{node.name}"];' for gid, node in graph.globals.items()]
    lines += [
        f'  {src} -> {dst} [label="{_edge_label(graph, src, dst)}"];' for src, dst in graph.edges
    ]
    lines.append("}")
    return "\n".join(lines)
