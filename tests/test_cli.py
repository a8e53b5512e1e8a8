"""`htam`'s top level: a subcommand pays only for its own area's imports."""

from __future__ import annotations

import subprocess
import sys

from htam_engine.cli import SUBCOMMANDS


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_subcommand_imports_no_other_area() -> None:
    code = (
        "import sys, htam_engine.cli as c; c.build_parser(['eval', 't.py', 'c.py']); "
        "print(sorted(m for _, m in c.SUBCOMMANDS if m in sys.modules))"
    )
    assert _python(code) == "['htam_engine.evaluate.cli']"


def test_help_and_a_misspelt_subcommand_list_them_all() -> None:
    for argv in ([], ["--help"], ["evl"]):
        code = f"import htam_engine.cli as c; print(c.build_parser({argv!r}).format_help())"
        shown = _python(code)
        assert all(name in shown for name, _ in SUBCOMMANDS), (argv, shown)
