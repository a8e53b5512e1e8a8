"""`htam`: the command line. Each area registers its own subcommand.

Contract (tests and users rely on it): `--json` prints exactly one JSON document on
stdout; human output goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Sequence

from htam_engine import __version__
from htam_engine.errors import UserError

# (subcommand, module that defines `register(subparsers)`); only the named subcommand's
# module is imported, so that no area pays for another's imports (all for `htam --help`).
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("optimize", "htam_engine.loop_cli"),
    ("eval", "htam_engine.evaluate.cli"),
    ("memory", "htam_engine.memory.cli"),
    ("bench", "htam_engine.sweep"),
    ("machine", "htam_engine.roofline"),
)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: with the subcommand it names only, or all when it names none."""
    parser = argparse.ArgumentParser(
        prog="htam",
        description=(
            "HTAM optimizes GPU (CUDA) and CPU (C++) kernels with a Hierarchical "
            "Transition Graph memory: it picks a direction, writes the next implementation "
            "(LLM or mechanical rewrite), compiles, verifies and times it, and learns."
        ),
    )
    parser.add_argument("--version", action="version", version=f"htam {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    named = first if first in dict(SUBCOMMANDS) else None
    for name, module in SUBCOMMANDS:
        if named in (None, name):
            importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except UserError as error:
        print(f"htam: error: {error}", file=sys.stderr)
        _machine_readable_error(args, str(error), error.kind)
        return 2
    except KeyboardInterrupt:
        print("htam: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug: the traceback for the report, the contract kept
        traceback.print_exc()
        _machine_readable_error(args, f"{type(error).__name__}: {error}", "internal_error")
        return 1


def _machine_readable_error(args: argparse.Namespace, message: str, kind: str) -> None:
    """Keep the stdout contract on failure too: one JSON document, or a last event."""
    if getattr(args, "events", False):
        from htam_engine import events

        print(events.to_line(events.Failed(message, kind)), flush=True)
    elif getattr(args, "json", False):
        print(json.dumps({"error": {"kind": kind, "message": message}}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
