"""`htam`'s top level: a subcommand pays only for its own area's imports."""

from __future__ import annotations

import subprocess
import sys

from htam_engine.cli import SUBCOMMANDS


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_subcommand_imports_no_other_area() -> None:
    code = (
        "import sys, htam_engine.cli as c; c.build_parser(['eval', 't.py', 'c.py']); "
        "print(sorted(m for _, m in c.SUBCOMMANDS if m in sys.modules))"
    )
    assert _python(code).stdout.strip() == "['htam_engine.evaluate.cli']"


def test_help_and_a_misspelt_subcommand_list_them_all() -> None:
    """`htam` and `htam --help` list every subcommand, and a misspelt one is told them all."""
    for argv in ([], ["--help"]):
        done = _python(f"import htam_engine.cli as c; c.main({argv!r})")
        shown = done.stdout + done.stderr  # --help prints on stdout, a bare `htam` on stderr
        assert all(f"\n    {name} " in shown for name, _ in SUBCOMMANDS), (argv, shown)
    refused = _python("import htam_engine.cli as c; c.main(['evl'])").stderr
    assert "invalid choice: 'evl'" in refused
    assert all(f"'{name}'" in refused for name, _ in SUBCOMMANDS), refused
