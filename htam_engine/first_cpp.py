"""A first C++ version of a bare KernelBench reference without an LLM, written in a child
process (`python -m htam_engine.translate`): tracing imports torch and runs the
reference's own code, which the loop's process (and the language server's) never does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from htam_engine.errors import NoStartError

STRATEGY = "naive C++ from the reference"
TIMEOUT_S = 300


def write_first_cpp(reference: Path) -> str:
    """The `load_cpp` module of a first `ModelNew` for `reference`; `NoStartError` naming
    the op (or the failure) when htam cannot write it."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "htam_engine.translate", str(reference)],
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise NoStartError(
            f"{reference.name}: tracing the reference took over {TIMEOUT_S} s"
        ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "source" in answer:
        return str(answer["source"])
    why = answer.get("error") or f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    raise NoStartError(f"{reference.name}: {why}")
