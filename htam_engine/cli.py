"""`htam`: the command line. Each area registers its own subcommand.

Contract (tests and users rely on it): `--json` prints exactly one JSON document on
stdout; human output goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from htam_engine import __version__

# (subcommand, module that defines `register(subparsers)`); imported lazily so that
# `htam --help` stays fast and no area pays for another's imports.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("optimize", "htam_engine.loop_cli"),
    ("eval", "htam_engine.evaluate.cli"),
    ("memory", "htam_engine.memory.cli"),
)


class UserError(Exception):
    """A problem the user can fix; printed as one clear line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
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
    for _name, module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except UserError as error:
        print(f"htam: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("htam: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
