"""Compile, verify and time candidates in isolated workers; see `runner` for the design.

`evaluate` and `sandbox_mode` are imported on first use: the verdict's types are light
(the language server reads them), the runner is not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from htam_engine.evaluate.verdict import Check, Duel, ErrorKind, EvalError, Limits, Verdict

if TYPE_CHECKING:
    from htam_engine.evaluate.runner import evaluate
    from htam_engine.evaluate.sandbox import sandbox_mode

__all__ = [
    "Check",
    "Duel",
    "ErrorKind",
    "EvalError",
    "Limits",
    "Verdict",
    "evaluate",
    "sandbox_mode",
]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from htam_engine.evaluate.runner import evaluate

        return evaluate
    if name == "sandbox_mode":
        from htam_engine.evaluate.sandbox import sandbox_mode

        return sandbox_mode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
